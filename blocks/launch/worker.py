"""The worker: rebuild a run from its run dir and train it (one process, or one rank of many).

Workers never run Hydra: they read the frozen ``config.yaml`` the driver wrote, which is
what makes sweeps of multi-process jobs and restarts safe.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from blocks.core.catalog import load
from blocks.core.environment import restart_count
from blocks.core.masking import hiding_output
from blocks.launch.collector import collection_paused, own_this_process
from blocks.launch.lifeline import WORKER_NAME, die_with_parent, name_process
from blocks.launch.ray_workers import IN_RAY_TASK_ENV
from blocks.launch.run_dir import (
    COMPLETED_WEIGHTS_FILE,
    WEIGHTS_FILE,
    Summary,
    completed_before,
    load_run,
    retire_summary,
)
from blocks.launch.torchrun import DRIVER_CONFIG_DIGEST_ENV, DRIVER_CONFIG_ENV, EXIT_INTERRUPTED
from blocks.spec.errors import BlocksError, TrainingError

if TYPE_CHECKING:
    from blocks.core.plan import Plan
    from blocks.runtime.preemption import Preemption
    from blocks.runtime.same_config import DriverConfig


def train(run_dir: Path, *, console: bool = True, own_process: bool = False) -> Summary:
    """Train the run in *run_dir* and write its ``summary.json`` (on failure too).

    *own_process*: this process runs this job only (a worker), so a stall ends it (see
    :func:`~blocks.runtime.trainer.build_run`); otherwise a stall fails the run with
    :class:`~blocks.runtime.health.StallError` and the process goes on.
    """
    started = time.perf_counter()
    load()
    frozen = load_run(run_dir)
    plan = frozen.plan
    plan.raise_for_errors()

    with collection_paused():
        from pytorch_lightning.utilities.exceptions import SIGTERMException

        from blocks.checkpoint.resume import sample_digests
        from blocks.checkpoint.weights import full_state_dict, is_sharded, save_weights, state_digest
        from blocks.runtime.callbacks import early_stop_reason, refused_by_callback
        from blocks.runtime.health import end_stall_watch
        from blocks.runtime.loggers import finalize_loggers
        from blocks.runtime.same_config import SameConfigOnEveryRank
        from blocks.runtime.trainer import build_run, record_progress

    driver = driver_config() if own_process else None
    checks = [SameConfigOnEveryRank(driver, frozen.config_text)] if driver is not None else []
    built = build_run(
        plan, run_dir, console=console, run_config=frozen.config, own_process=own_process, checks=checks
    )
    if built.preemption is not None and plan.derived.world_size == 1 and not os.environ.get(IN_RAY_TASK_ENV):
        # A signal while fit sets up the data or restores the checkpoint stops the run too. Not
        # with several processes: a rank waiting for its peers in C code would never see the
        # flag, where the signal's default action ends it (torchrun's driver writes the summary);
        # nor in a Ray task, whose signals Ray handles.
        built.preemption.arm()
    trainer, module = built.trainer, built.module
    summary = Summary(
        status="completed",
        world_size=plan.derived.world_size,
        restarts=restart_count(),
        resumed_from=built.resume_from,
    )
    refused: BlocksError | None = None
    try:
        try:
            trainer.fit(module, datamodule=built.datamodule, ckpt_path=built.resume_from, weights_only=True)
        except Exception as exc:
            refused = refused_by_callback(exc, built.users)
            if refused is None:
                raise
            raise refused from None
        summary.reason = early_stop_reason(trainer, plan.derived.total_steps)
        if plan.derived.val_samples and module.validated_at_step != trainer.global_step:
            trainer.validate(module, datamodule=built.datamodule, verbose=False)
    except BaseException as exc:
        # Preempted (SIGTERM/SIGINT, agreed by every rank) is a SIGTERMException; Lightning turns
        # a second Ctrl-C into SystemExit after a graceful shutdown.
        if isinstance(exc, (KeyboardInterrupt, SystemExit, SIGTERMException)):
            summary.status, summary.reason = (
                "interrupted",
                interruption_reason(
                    built.preemption,
                    trainer.global_step,
                    plan,
                    run_dir,
                    saved=built.checkpointer is not None
                    and built.checkpointer.last_saved_step == trainer.global_step,
                ),
            )
        else:
            summary.status, summary.reason = "failed", failure_reason(exc, plan)
        if (
            isinstance(exc, BlocksError)
            and not isinstance(exc, TrainingError)
            and exc is not refused  # in Lightning's set-up, before the first step
            and built.recorder.training_started
        ):
            raise TrainingError(exc.problems) from exc  # not a job that could not start: exit status 1
        raise
    finally:
        try:
            built.recorder.close()
            record_progress(summary, plan, trainer.global_step, built.recorder)
            weights_error: Exception | None = None
            # Gathering sharded weights is a collective: only safe when every rank got this far.
            if summary.status == "completed" or not is_sharded(module.model):
                state = full_state_dict(module.model)
                if trainer.is_global_zero:
                    summary.state_digest = state_digest(state)
                    if summary.status == "completed" and plan.checkpoint.save_weights:
                        try:
                            samples = sample_digests(plan.data, plan.trainer.seed)
                            save_weights(
                                state, run_dir / WEIGHTS_FILE, step=trainer.global_step, samples=samples
                            )
                            (run_dir / COMPLETED_WEIGHTS_FILE).unlink(missing_ok=True)
                        except Exception as exc:
                            weights_error = exc
                            reason = failure_reason(exc, plan)
                            summary.status, summary.reason = (
                                "failed",
                                f"could not write {WEIGHTS_FILE}: {reason}",
                            )
                    elif summary.status == "completed":  # checkpoint.save_weights=false
                        _settle_set_aside_weights(run_dir, summary)
            summary.wall_s = time.perf_counter() - started
            if summary.status == "completed" and not built.recorder.samples_seen:
                keep_finished_figures(summary, completed_before(run_dir))
            # after Lightning's own finalize("failed") of an interrupted run: the status is settled here
            finalize_loggers(built.loggers, summary.status)
            # The job has ended: from here its stall watchdog stays quiet, unless it already took the
            # stall over (it records it). A peer that left after a stall breaks this rank's
            # collectives too; the stall is the reason.
            recorded_by_watchdog = end_stall_watch(trainer)
            if trainer.is_global_zero and not recorded_by_watchdog:
                summary.write(run_dir)
                if console and plan.monitor.progress != "off":
                    _print_summary(summary)
            _shut_down_process_group(wait_for_peers=summary.status == "completed")
            if weights_error is not None:
                raise weights_error
        finally:
            end_stall_watch(trainer)  # also when recording the run failed
            if built.preemption is not None:
                built.preemption.disarm()  # the grace timer and the signal handlers it armed
    return summary


def driver_config() -> DriverConfig | None:
    """The ``config.yaml`` this node's driver wrote, as it passed it to torchrun's workers (None when it did not)."""
    from blocks.runtime.same_config import DriverConfig

    digest = os.environ.get(DRIVER_CONFIG_DIGEST_ENV)
    return None if not digest else DriverConfig(digest, os.environ.get(DRIVER_CONFIG_ENV))


def _settle_set_aside_weights(run_dir: Path, summary: Summary) -> None:
    """A completed run that writes no weights file: the last completed run's, set aside, are its own again if it trained nothing, else stale."""
    set_aside = run_dir / COMPLETED_WEIGHTS_FILE
    if not set_aside.exists():
        return
    finished = completed_before(run_dir)
    if finished is not None and finished.state_digest and finished.state_digest == summary.state_digest:
        os.replace(set_aside, run_dir / WEIGHTS_FILE)
    else:
        set_aside.unlink()


def keep_finished_figures(summary: Summary, finished: Summary | None) -> None:
    """Give *summary* of a rerun that trained nothing the figures of the completed run it found.

    Only when *finished* (the run dir's last completed summary) ended with the same weights at
    the same step: its metrics (this session's newer values win), throughput and checkpoint
    stall describe the training that made them. ``wall_s`` stays this session's.
    """
    if (
        finished is None
        or finished.status != "completed"
        or finished.global_step != summary.global_step
        or not finished.state_digest
        or finished.state_digest != summary.state_digest
    ):
        return
    summary.metrics = {**finished.metrics, **summary.metrics}
    summary.reason = summary.reason or finished.reason
    summary.samples_per_s, summary.tokens_per_s = finished.samples_per_s, finished.tokens_per_s
    summary.train_s = finished.train_s
    summary.steady_samples_per_s = finished.steady_samples_per_s
    summary.steady_tokens_per_s = finished.steady_tokens_per_s
    summary.checkpoint_stall_s = finished.checkpoint_stall_s


def interruption_reason(
    preemption: Preemption | None, step: int, plan: Plan, run_dir: Path, *, saved: bool = True
) -> str:
    """``summary.json``'s reason for a run a signal stopped at optimizer *step*, and the command that goes on from its checkpoint.

    *saved*: whether this run saved a checkpoint at *step* (read only when a second Ctrl-C came
    after training stopped: it interrupts the save).
    """
    at_once = preemption is not None and preemption.received and not preemption.stopped_by
    unsaved = preemption is not None and preemption.stopped_by and preemption.interrupted_again and not saved
    if at_once:  # a second Ctrl-C: mid-step, where a checkpoint could hold a half-made step
        stopped = f"a second SIGINT stopped training at once, after step {step}, without saving"
    elif unsaved:
        stopped = (
            f"{preemption.stopped_by} stopped training at step {step}; a second SIGINT interrupted its save"  # type: ignore[union-attr]
        )
    else:
        by = (
            preemption.stopped_by if preemption is not None and preemption.stopped_by else "SIGINT or SIGTERM"
        )
        stopped = f"{by} stopped training at step {step}"
    if step == 0:
        return f"{stopped}, before its first step: nothing was trained or saved; run the same command to start it"
    if not plan.checkpoint.enabled:
        return f"{stopped}; checkpointing is off (checkpoint.enabled=false), so it cannot resume"
    sweep_dir, pipeline_dir = run_dir.parent, os.environ.get(PIPELINE_DIR_ENV)
    key = "checkpoint.resume"
    if (sweep_dir / SWEEP_CONFIG).exists():  # a sweep job: Hydra chooses its run dir from the sweep's
        how = f"run the same sweep with hydra.sweep.dir={sweep_dir}"
    elif pipeline_dir:  # a stage: the pipeline's command skips the finished stages and resumes this one
        how, key = f"run the same command with hydra.run.dir={pipeline_dir}", f"{run_dir.name}.{key}"
    else:
        how = f"run the same command with hydra.run.dir={run_dir}"
    resume = plan.checkpoint.resume
    if resume != "auto":  # the command as given would start over from where this run started
        how += f" and {key}=auto ({key}={resume} would start over)"
    if at_once or unsaved:
        return f"{stopped}: to go on from its last checkpoint, {how}"
    return f"{stopped}; its checkpoint was saved (unless checkpoint.on_signal=false): to resume, {how}"


SWEEP_CONFIG = "multirun.yaml"
"""What Hydra writes into a sweep dir: beside a job's run dir, it makes the job one of a sweep."""
PIPELINE_DIR_ENV = "BLOCKS_PIPELINE_DIR"
"""Set while a pipeline's train stage runs: the pipeline's dir, the ``hydra.run.dir`` its command names (not the stage's)."""


def failure_reason(exc: BaseException, plan: Plan) -> str:
    """``summary.json``'s reason for *exc*; a timed-out collective also says what it means and which key sets it."""
    from blocks.runtime.health import StallError

    if isinstance(exc, StallError):  # its message is the stall watchdog's reason
        return str(exc)
    reason = f"{type(exc).__name__}: {exc}"
    message = str(exc).lower()
    limit = plan.strategy.collective_timeout()
    if plan.derived.world_size > 1 and limit is not None and ("timeout" in message or "timed out" in message):
        return (
            f"a collective operation timed out after strategy.collective_timeout_s={limit:g}s: another rank "
            f"stopped or fell far behind (its log says why; monitor.stall_timeout_s dumps every rank's stack) "
            f"({reason})"
        )
    return reason


def _print_summary(summary: Summary) -> None:
    """The end-of-run table on the console (plain text without a terminal)."""
    from rich.console import Console

    from blocks.monitor.sinks import summary_table

    Console(soft_wrap=False).print(summary_table(summary.shown()))  # hidden before rich cuts a cell


def _shut_down_process_group(*, wait_for_peers: bool) -> None:
    """Leave the process group together (after a barrier) so no rank tears it down under another."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if wait_for_peers:
            dist.barrier()
        dist.destroy_process_group()


def run_worker(run_dir: Path, *, interrupted_status: int = 0) -> int:
    """Train the run in *run_dir* as one worker process; the exit status torchrun, srun or mpirun should see.

    *interrupted_status* when training was interrupted on purpose (its checkpoint is saved):
    0 under torchrun or Ray, which must not restart the workers (the driver reads "interrupted"
    from ``summary.json``); srun's and mpirun's workers exit 130 (see :func:`main`). 0 when
    training completed; 1 when the health policy stopped it or a problem of the setup met once
    training started (a :class:`TrainingError`); 2 for a config mistake found before.
    Any other exception propagates.
    """
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    from blocks.runtime.health import NonFiniteError

    try:
        train(run_dir, own_process=True)
    except BlocksError as exc:
        return _report_user_error(run_dir, exc)
    except NonFiniteError as exc:  # the health policy stopped training: summary.json has the reason
        print(f"blocks: training stopped: {exc}", file=sys.stderr, flush=True)
        return 1
    except (KeyboardInterrupt, SystemExit, SIGTERMException) as exc:
        print(f"blocks: training interrupted: {exc or type(exc).__name__}", file=sys.stderr, flush=True)
        return interrupted_status
    return 0


def main(argv: list[str] | None = None) -> None:
    """``python -m blocks.launch.worker RUN_DIR``: the entry point srun, mpirun and Ray's actors start.

    Started by srun or mpirun (no torchrun or Ray to restart it), an interrupted worker exits
    130, as ``blocks run`` does, so a batch script can requeue the job.
    """
    parser = argparse.ArgumentParser(prog="blocks-worker", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    own_this_process()
    if not die_with_parent():
        os._exit(1)  # an orphan: the driver that started it is gone
    restarted_by_launcher = "TORCHELASTIC_RESTART_COUNT" in os.environ  # torchrun or Ray's driver
    code = _run_process(args.run_dir, interrupted_status=0 if restarted_by_launcher else EXIT_INTERRUPTED)
    # Everything is written and the process group is destroyed. Skip interpreter
    # finalization: with gloo, a backend thread can still be joinable when C++ statics are
    # destroyed, which aborts a finished worker ("terminate called without an active
    # exception") and makes torchrun report a completed job as failed. Only this process
    # entry point ends the process; library code returns the status.
    os._exit(code)


def forked_worker(run_dir: str) -> None:
    """One rank of a torchrun job, forked from the forkserver that preloaded :mod:`blocks.launch.forkserver`.

    Exits with the worker's status when it is not 0; torchrun's multiprocessing wrapper ends
    the process without interpreter finalization. After a 0, that wrapper hands the result to
    torchrun through a pipe and waits until torchrun has read every rank's; a torchrun that is
    shutting down (it passed on a signal, or another rank failed) never reads them and kills
    the waiting workers only after 30 s. The result is in the pipe at once, so the process ends
    :data:`RESULT_HANDOVER_S` later whether or not torchrun read it.
    """
    from lightning_fabric.utilities.rank_zero import rank_zero_only

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the forkserver ignores it (blocks.launch.forkserver)
    if not die_with_parent(forked_by_server=True):
        os._exit(1)  # an orphan: the torchrun that started the forkserver is gone
    rank = int(os.environ.get("RANK", "0"))
    name_process(f"{WORKER_NAME}{rank}")
    # Lightning reads the rank from the environment at import, which happened in the forkserver.
    rank_zero_only.rank = rank  # type: ignore[attr-defined]
    code = _run_process(Path(run_dir))
    if code:
        sys.exit(code)
    handover = threading.Timer(RESULT_HANDOVER_S, os._exit, args=(0,))
    handover.daemon = True
    handover.start()


RESULT_HANDOVER_S = 1.0
"""How long a finished torchrun worker waits for torchrun to read its result before it ends anyway."""


def _run_process(run_dir: Path, *, interrupted_status: int = 0) -> int:
    """Train as this process's one job and flush every log; the process's exit status (:func:`run_worker`'s)."""
    _record_attempt(run_dir)
    _record_rank(run_dir, STARTED)
    try:
        _log_warnings_to_run_dir(run_dir)
        with hiding_output():  # a value read from the environment is shown as ${oc.env:NAME}
            code = run_worker(run_dir, interrupted_status=interrupted_status)
    finally:
        _record_rank(run_dir, EXITED)
    _finalize_mpi()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


LOG_FILE = "blocks.log"


def launcher_rank() -> str | None:
    """The global rank of this process as its launcher (torchrun, srun, mpirun) says; None without one."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", os.environ.get("OMPI_COMM_WORLD_RANK")))


def _log_warnings_to_run_dir(run_dir: Path) -> None:
    """Append this rank's warnings and errors (log records and ``warnings.warn``) to the run dir's ``blocks.log``.

    One process logs through the driver's own ``blocks.log`` (Hydra's job log); workers that
    torchrun, srun or mpirun started are other processes, with the rank in every line.
    """
    rank = launcher_rank()
    if rank is None:
        return
    handler = logging.FileHandler(run_dir / LOG_FILE)  # appends: every rank and the driver share the file
    handler.setLevel(logging.WARNING)
    handler.setFormatter(
        logging.Formatter(f"[%(asctime)s][rank {rank}][%(name)s][%(levelname)s] - %(message)s")
    )
    logging.getLogger().addHandler(handler)
    logging.captureWarnings(True)


ATTEMPT_FILE = ".attempt"
"""The restart count of the workers' current attempt under torchrun (written by global rank 0)."""


def _record_attempt(run_dir: Path) -> None:
    """Note torchrun's restart count, so a summary the driver writes counts the restarts that happened.

    A restarted attempt first takes away the summary the failed one wrote: the job is running again.
    """
    under_torchrun = "TORCHELASTIC_RESTART_COUNT" in os.environ
    if under_torchrun and os.environ.get("RANK", "0") == "0":
        if restart_count() > 0:
            retire_summary(run_dir)
        (run_dir / ATTEMPT_FILE).write_text(str(restart_count()))


RANKS_DIR = ".ranks"
"""One file per torchrun rank of the current attempt: ``<attempt> started``, then ``<attempt> exited``.

A rank that exits in any way Python sees (done, an exception, SIGTERM) records it; one that a
signal killed (SIGKILL, the OOM killer, a crash in C) stays ``started``. torchrun names only the
first failure it notices, often a peer's broken connection; this names the rank that died.
"""
STARTED, EXITED = "started", "exited"


def _record_rank(run_dir: Path, state: str) -> None:
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ or "RANK" not in os.environ:
        return
    with contextlib.suppress(OSError):
        (run_dir / RANKS_DIR).mkdir(exist_ok=True)
        (run_dir / RANKS_DIR / os.environ["RANK"]).write_text(f"{restart_count()} {state}")


def vanished_ranks(run_dir: Path, attempt: int) -> list[int]:
    """Ranks of *attempt* that started and never exited: a signal killed them (see :data:`RANKS_DIR`)."""
    vanished = []
    with contextlib.suppress(OSError):
        for path in (run_dir / RANKS_DIR).iterdir():
            if path.name.isdigit() and path.read_text().split() == [str(attempt), STARTED]:
                vanished.append(int(path.name))
    return sorted(vanished)


def _report_user_error(run_dir: Path, error: BlocksError) -> int:
    """A config mistake found in a worker (e.g. an incompatible checkpoint): say so, record it; its exit status.

    A :class:`TrainingError` is recorded already: :func:`train` wrote the step it reached.
    """
    text = "\n".join(problem.render() for problem in error.problems)
    if isinstance(error, TrainingError):  # train() wrote summary.json: failed, at the step it reached
        print(f"blocks: training failed:\n{text}", file=sys.stderr, flush=True)
        return error.exit_code
    print(f"blocks: the job cannot run:\n{text}", file=sys.stderr, flush=True)
    if launcher_rank() in (None, "0"):  # every rank refuses alike; one writes
        Summary(status="failed", reason=text).write(run_dir)
    return error.exit_code


def _finalize_mpi() -> None:
    """Under mpirun (Lightning's MPIEnvironment uses mpi4py) MPI must be finalized, or mpirun fails the job."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


if __name__ == "__main__":
    main()
