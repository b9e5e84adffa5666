"""A Hydra launcher that runs a sweep's jobs as Ray tasks (``hydra/launcher=ray``).

Each job's driver (plan, run dir, workers) runs in a Ray task of its own, so the jobs of a
``-m`` sweep run side by side on one cluster. Jobs with ``trainer.launcher=ray`` place their
workers on the same cluster through placement groups; their process groups pick free ports on
the node of their rank 0, so jobs never clash. Hydra's own ``hydra-ray-launcher`` pins
``cloudpickle<3`` and pulls in boto3 for its AWS mode; this one uses Ray's public API only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

if TYPE_CHECKING:
    from blocks.launch.ray_workers import Signals

log = logging.getLogger(__name__)


class RayLauncher(Launcher):
    """Runs each job of a sweep as a Ray task on the cluster at ``address`` (``$RAY_ADDRESS``, else a local instance).

    ``job_cpus`` is what a job's driver task reserves; its workers reserve their own resources
    (``trainer.launcher=ray``), so the default 0 lets as many jobs run as the workers fit.
    """

    def __init__(self, address: str | None = None, job_cpus: float = 0.0) -> None:
        self.address = address
        self.job_cpus = job_cpus
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep what each job needs (Hydra calls this once per sweep)."""
        self.config = config
        self.task_function = task_function
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Run every job as a Ray task and return their results in order."""
        import ray

        from blocks.launch.ray_workers import ADDRESS_ENV, Signals

        setup_globals()
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        # From here a signal stops the sweep (and its jobs) instead of ending this process.
        signals = Signals()
        signals.install()
        if not ray.is_initialized():
            address = self.address or os.environ.get(ADDRESS_ENV) or "local"
            local = {"include_dashboard": False} if address == "local" else {}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)  # see blocks.launch.ray_workers.connect
                    ray.init(address=address, logging_level="warning", **local)
            except BaseException:
                signals.restore()
                raise
            signals.take_back()
        if signals.received:  # while Ray started: no job ran
            _stopped(f"{signal.Signals(signals.received[0]).name} received while Ray started")
        log.info(f"Ray launcher is launching {len(job_overrides)} jobs, sweep output dir: {sweep_dir}")
        for idx, overrides in enumerate(job_overrides):
            log.info(f"\t#{initial_job_idx + idx} : {' '.join(filter_overrides(overrides))}")
        remote = ray.remote(num_cpus=self.job_cpus, max_retries=0)(_execute_job)
        state = Singleton.get_state()
        started = time.time()
        try:
            futures = [
                remote.remote(
                    initial_job_idx + idx,
                    list(overrides),
                    self.hydra_context,
                    self.config,
                    self.task_function,
                    state,
                )
                for idx, overrides in enumerate(job_overrides)
            ]
            outcomes = self._await(ray, job_overrides, initial_job_idx, futures, signals, started)
        except BaseException:
            signals.restore()
            raise
        if isinstance(outcomes, str):
            _stopped(outcomes)
        signals.restore()
        return outcomes

    def _await(
        self,
        ray: Any,
        job_overrides: Sequence[Sequence[str]],
        initial_job_idx: int,
        futures: list[Any],
        signals: Signals,
        started: float,
    ) -> list[JobReturn] | str:
        """Every job's result in order, or why the sweep stopped early (a signal, an interrupted job).

        A job whose task dies fails alone. A signal to this driver stops every job still
        running as a signal stops one job: :func:`ray.cancel` (not forced) runs SIGINT's handler
        in the job's task, so the job saves a checkpoint, says ``interrupted`` and ends; jobs not
        started yet never start. A job a signal stopped itself stops the jobs after it that way
        (as the basic launcher, which would not start them). A second signal ends the running
        jobs at once.
        """
        from blocks.launch.ray_workers import POLL_S

        results: list[JobReturn] = []
        stopped: str | None = None
        forced = False
        for idx, future in enumerate(futures):
            while True:
                if signals.received and stopped is None:
                    stopped = f"{signal.Signals(signals.received[0]).name} received"
                    print(
                        f"blocks: {stopped}; stopping the running jobs, each saves a checkpoint",
                        file=sys.stderr,
                        flush=True,
                    )
                    _cancel(ray, futures[idx:], force=False)
                if len(signals.received) > 1 and not forced:
                    forced = True
                    _cancel(ray, futures[idx:], force=True)
                ready, _ = ray.wait([future], timeout=POLL_S)
                if ready:
                    break
            try:  # one at a time: a job whose task dies fails alone, the others run on
                results.append(ray.get(future))
            except ray.exceptions.RayError as exc:
                if stopped is not None and isinstance(exc, ray.exceptions.TaskCancelledError):
                    continue  # stopped before it began: nothing to record
                try:
                    results.append(
                        self._crashed(initial_job_idx + idx, list(job_overrides[idx]), exc, started)
                    )
                except JobInterrupted as interrupted:
                    if stopped is None:  # as the basic launcher: an interrupted job ends the sweep
                        stopped = str(interrupted)
                        _cancel(ray, futures[idx + 1 :], force=False)
        return stopped if stopped is not None else results

    def _crashed(self, idx: int, overrides: list[str], error: Exception, started: float) -> JobReturn:
        """The result of job *idx*, whose Ray task died (its worker killed, its node lost): a failed job.

        Its run dir gets a ``failed`` summary naming the crash (unless this attempt wrote one),
        and the sweeper gets the worst value for ``monitor.objective_mode``, as for a job that
        failed in the basic launcher: Hydra's sweepers end the sweep on a job whose status is
        FAILED, so the job's return says COMPLETED and its value ranks it last.
        """
        from hydra.core.hydra_config import HydraConfig

        from blocks.launch.driver import failed_objective, record_failed_start
        from blocks.launch.sweep import job_lost

        assert self.config is not None and self.hydra_context is not None
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
            sweep_config.hydra.job.num = idx
        HydraConfig.instance().set_config(sweep_config)
        run_dir = Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
        if interrupted_since(run_dir, started):  # its driver ended the task with exit status 130
            raise JobInterrupted(f"job #{idx} was interrupted (its summary.json in {run_dir} says why)")
        reason = f"the job's Ray task died ({type(error).__name__}): " + str(error).splitlines()[0]
        log.error(f"job #{idx} ({' '.join(filter_overrides(overrides))}) crashed: {reason}")
        run_dir.mkdir(parents=True, exist_ok=True)
        record_failed_start(run_dir, reason, started)
        job_lost(idx, run_dir, str(sweep_config.hydra.sweep.dir))
        task_cfg = OmegaConf.masked_copy(sweep_config, [str(k) for k in sweep_config if k != "hydra"])
        return JobReturn(
            overrides=overrides,
            cfg=task_cfg,
            hydra_cfg=sweep_config,
            working_dir=str(run_dir),
            task_name=str(sweep_config.hydra.job.name),
            status=JobStatus.COMPLETED,
            _return_value=failed_objective(task_cfg),
        )


def _stopped(why: str) -> NoReturn:
    """End the sweep's driver as a signal ends a job: a line saying why, and status 130.

    The signal handlers stay: another Ctrl-C would break Ray's shutdown as this process exits.
    """
    from blocks.launch.torchrun import EXIT_INTERRUPTED

    print(f"blocks: {why}; the sweep stops (the same command resumes it)", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_INTERRUPTED)


def _cancel(ray: Any, futures: list[Any], *, force: bool) -> None:
    """Stop the tasks of *futures*' jobs: not forced, a running job saves and ends as on a signal."""
    for future in futures:
        with contextlib.suppress(Exception):  # a task that just ended
            ray.cancel(future, force=force, recursive=False)


class JobInterrupted(Exception):
    """A sweep job's Ray task ended because a signal stopped the job (its ``summary.json`` says ``interrupted``)."""


def interrupted_since(run_dir: Path, started: float) -> bool:
    """Whether *run_dir*'s ``summary.json``, written since *started* (``time.time()``), says the job was interrupted.

    A stopped job's driver exits 130, which ends its Ray task the way a crash would.
    """
    from blocks.launch.run_dir import SUMMARY_FILE, Summary

    path = run_dir / SUMMARY_FILE
    try:
        return path.stat().st_mtime >= started and Summary.read(run_dir).status == "interrupted"
    except (OSError, ValueError, TypeError):
        return False


def _execute_job(
    idx: int,
    overrides: list[str],
    hydra_context: HydraContext,
    config: DictConfig,
    task_function: TaskFunction,
    singleton_state: dict[Any, Any],
) -> JobReturn:
    """One job of the sweep, inside a Ray task: what Hydra's basic launcher does for it."""
    from hydra.core.hydra_config import HydraConfig

    from blocks.launch.ray_workers import IN_RAY_TASK_ENV

    os.environ[IN_RAY_TASK_ENV] = "1"
    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, overrides)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    return run_job(
        hydra_context=hydra_context,
        config=sweep_config,
        task_function=task_function,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
