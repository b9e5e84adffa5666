"""The driver: what ``blocks run`` does inside each Hydra job.

A single ``blocks run`` is composed once and planned once before anything is written
(:func:`plan_run`, :func:`check_run`); Hydra's job runner then gets that composed config and
the driver that plan. In a sweep Hydra composes each job and the driver plans it. The driver
freezes ``config.yaml`` and ``plan.json`` into the run dir, and trains: in its own process for
one process, through torchrun for several (or when restarts are asked for).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import logging
import os
import shutil
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsspec.core import url_to_fs
from fsspec.implementations.memory import MemoryFileSystem
from omegaconf import DictConfig, OmegaConf

from blocks.checkpoint.base import CheckpointBlock
from blocks.checkpoint.resume import (
    START_FILE,
    checkpoint_dir,
    read_start,
    record_start,
    refuse_foreign_in_the_way,
    resolve_resume,
    resume_message,
    stopped_early_of,
)
from blocks.checkpoint.storage import preflight_storage
from blocks.checkpoint.store import drop_kept, read_manifest
from blocks.compat.hydra_private import run_output_dir
from blocks.core import catalog
from blocks.core.compose import Composed, config_to_blocks
from blocks.core.environment import Environment
from blocks.core.jobs import Job, compose, plan_blocks, plan_job, refuse_interpolated_paths
from blocks.core.masking import hiding_output
from blocks.core.plan import Plan
from blocks.core.provenance import version_notes
from blocks.launch.collector import collect_earlier_jobs, collection_paused
from blocks.launch.lock import checkpoint_dir_locked, is_held, locked
from blocks.launch.ray_workers import uses_ray
from blocks.launch.run_dir import (
    CHECKPOINTS_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
    FinishedRunKept,
    Summary,
    finished_how,
    freeze_config,
    how_to_train_further,
    load_plan,
    recorded_config,
    refuse_rewriting_finished,
    retire_summary,
    write_job_files,
)
from blocks.launch.sweep import REFUSED, RunDirTaken, SweepJob, current_job, job_ended
from blocks.launch.torchrun import (
    EXIT_INTERRUPTED,
    EXIT_NO_RENDEZVOUS,
    FAILURES_FILE,
    multi_node_job,
    needs_launcher,
    no_rendezvous,
    read_failures,
    rendezvous_settings,
    run_torchrun,
)
from blocks.launch.worker import ATTEMPT_FILE, RANKS_DIR, vanished_ranks
from blocks.launch.worker_blocks import refuse_blocks_workers_cannot_load
from blocks.monitor.figures import objective_value
from blocks.spec.errors import BlocksError, TrainingError
from blocks.spec.imports import refuse_objects

log = logging.getLogger(__name__)


def run_job(cfg: DictConfig, checked: Checked | None = None) -> float | None:
    """The Hydra task function: plan, write the run dir, train. Returns ``monitor.objective`` for sweepers.

    *checked* is the job as ``blocks run`` composed and planned it before Hydra started it
    (:func:`check_run`): its plan is used, not made again.
    """
    with hiding_output():  # launcher plugins (joblib, submitit, Ray) run jobs in processes of their own
        return _run_job(cfg, checked)


def _run_job(cfg: DictConfig, checked: Checked | None) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    catalog.load()  # launcher plugins (joblib, submitit) run jobs in fresh processes
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    choices = job_choices(hydra_cfg)
    # In a sweep a failed job is recorded (its summary.json) and the sweep goes on; the sweeper
    # gets the worst value there is. An interrupted job stops the sweep.
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    sweep_job = current_job() if in_sweep else None
    started = time.time() - 1.0  # some file systems keep modification times to the second
    try:
        if in_sweep:
            collect_earlier_jobs()
        if in_sweep and checked is None:
            checked = _planned_by_precheck(cfg, choices, run_dir, list(hydra_cfg.overrides.task))
        with held(run_dir, cfg, choices, checked, sweep_job) as written:
            plan = written.plan
            summary = launch(run_dir, plan, written.config_text)
    except JobFailed as exc:
        print(f"blocks: {exc} (run dir: {run_dir})", file=sys.stderr)
        job_ended(run_dir, exc.summary.status)
        if in_sweep and exc.summary.status != "interrupted":
            return failed_objective(cfg)
        raise SystemExit(exc.exit_status) from None
    except BlocksError as exc:
        # A TrainingError was met once training started: the job failed (summary.json says so).
        what = "training failed" if isinstance(exc, TrainingError) else "the job could not start"
        print(f"blocks: {what} (run dir: {run_dir})", file=sys.stderr)
        for problem in exc.problems:
            print(problem.render(), file=sys.stderr)
        if in_sweep:
            if isinstance(exc, (RunDirTaken, FinishedRunKept)):  # refused before writing: its summary stays
                job_ended(run_dir, REFUSED)
            else:
                job_ended(run_dir, "failed")
                record_failed_start(
                    run_dir, "; ".join(f"{p.key}: {p.message}" for p in exc.problems), started
                )
            return failed_objective(cfg)
        raise SystemExit(exc.exit_code) from None
    except Exception as exc:
        if not in_sweep:
            raise
        print(f"blocks: the job crashed (run dir: {run_dir})", file=sys.stderr)
        traceback.print_exc()
        job_ended(run_dir, "failed")
        record_failed_start(run_dir, f"{type(exc).__name__}: {exc}", started)
        return failed_objective(cfg)
    job_ended(run_dir, summary.status)
    value = objective(plan, summary)
    if value is None and in_sweep:
        log.warning(
            "the job in %s completed without %s or train/loss (it trained no step): the sweeper is given "
            "the value of a failed job",
            run_dir,
            plan.monitor.objective,
        )
        return failed_objective(cfg)
    return value


def record_failed_start(run_dir: Path, reason: str, started: float) -> None:
    """Make ``summary.json`` of a sweep job that ended before its run did say ``failed`` (*reason*).

    The sweep counts its jobs' outcomes from their summaries (:mod:`blocks.launch.sweep`): a job
    that could not start must say so, or the sweep would exit 0. A summary this attempt wrote
    (since *started*, a ``time.time()``) is kept, and so is a completed one (an attempt that got
    as far as starting set it aside); another an earlier run of the same job dir left is replaced. Nothing is written into a run dir another live job holds, and a write that fails
    is logged rather than ending the sweep.
    """
    path = run_dir / SUMMARY_FILE
    try:
        if (path.exists() and path.stat().st_mtime >= started) or is_held(run_dir):
            return
        if path.exists() and Summary.read(run_dir).status == "completed":
            return  # a finished run's record, untouched by an attempt that never began (it sets it aside first)
        Summary(status="failed", reason=reason).write(run_dir)
    except OSError as exc:
        print(f"blocks: could not record the failure in {path}: {exc}", file=sys.stderr)


PLANNED: dict[tuple[str, ...], Plan] = {}
"""The plans ``blocks run -m`` made of each sweep job before launching any, by :func:`job_key`.

A job that Hydra runs in this process (the basic launcher) uses its plan instead of planning
again; a job in another process (joblib, submitit, Ray) plans itself.
"""


def job_key(overrides: Sequence[str]) -> tuple[str, ...]:
    """A job's overrides without Hydra's own settings: how :data:`PLANNED` finds a job's plan."""
    return tuple(o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/")))


def _planned_by_precheck(
    config: DictConfig, choices: dict[str, str], run_dir: Path, overrides: list[str]
) -> Checked | None:
    """The sweep job as the precheck planned it, in its run dir (None when it was not planned here).

    The precheck planned the job before its run dir existed, so its checkpoint block has no
    run-dir default yet; nothing the plan checks or derives reads that path (the blocks are
    compared to be sure), so the plan holds with the frozen blocks in it.
    """
    planned = PLANNED.pop(job_key(overrides), None)
    if planned is None:
        return None
    frozen = freeze_config(config, run_dir)
    blocks = config_to_blocks(frozen)
    checkpoint = blocks.get("checkpoint")
    if not isinstance(checkpoint, CheckpointBlock) or blocks.keys() != planned.blocks.keys():
        return None
    unfrozen = {**blocks, "checkpoint": dataclasses.replace(checkpoint, dir=planned.checkpoint.dir)}
    if unfrozen != dict(planned.blocks):
        return None
    plan = dataclasses.replace(planned, blocks=blocks, choices=choices)
    preflight_job(plan)
    return Checked(run_dir=run_dir, hydra_config=None, config=frozen, plan=plan)


def job_choices(hydra: Any) -> dict[str, str]:
    """The option of each group a Hydra job chose (``hydra.runtime.choices`` without Hydra's own), as ``plan.json`` records them."""
    return {str(k): str(v) for k, v in hydra.runtime.choices.items() if not str(k).startswith("hydra/")}


def failed_objective(cfg: DictConfig) -> float:
    """The value a failed sweep job returns: the worst for ``monitor.objective_mode`` (Optuna records it, ranks it last)."""
    mode = str(OmegaConf.select(cfg, "monitor.objective_mode", default="min"))
    return float("-inf") if mode == "max" else float("inf")


def objective(plan: Plan, summary: Summary) -> float | None:
    """The value a sweeper optimizes: ``monitor.objective``, else (minimized) ``train/loss``; None when the run has neither.

    A throughput objective is the run's steady figure (see :func:`objective_value`). A maximized
    objective has no fallback: a sweeper maximizing the loss would pick the worst model.
    """
    figures = dataclasses.asdict(summary)
    value = objective_value(figures, plan.monitor.objective)
    if value is None and plan.monitor.objective_mode != "max":
        return objective_value(figures, "train/loss")
    return value


def exit_code(summary: Summary) -> int:
    """The exit status of ``blocks run`` for a job that did not complete: 130 when interrupted, else 1."""
    return EXIT_INTERRUPTED if summary.status == "interrupted" else 1


@dataclass(frozen=True)
class Checked:
    """A job composed once and planned once before it runs: a single run (:func:`check_run`) or a sweep job.

    Attributes:
        run_dir: the run dir Hydra will create (``hydra.run.dir``, absolute).
        hydra_config: Hydra's whole composed config of a single run, handed to Hydra's job
            runner as is (None for a sweep job, which Hydra's launcher composed).
        config: the job config as the run will use it (:func:`freeze_config`).
        plan: its plan, checked and preflighted.
    """

    run_dir: Path
    hydra_config: DictConfig | None
    config: DictConfig
    plan: Plan


def frozen_for_run(job: Job) -> Composed:
    """The config a single run of *job* will use: frozen with the run dir its ``hydra.run.dir`` names."""
    run_dir = Path(run_output_dir(job.hydra_config))
    choices = job_choices(job.hydra_config.hydra)
    return Composed(config=freeze_config(job.composed.config, run_dir), choices=choices)


def plan_run(overrides: list[str], config_dir: str | None = None) -> tuple[Job, Composed, Plan]:
    """Compose a single run once and plan it once, as it will run (in the run dir Hydra will create).

    Raises ``ConfigError`` when the overrides do not compose; the plan may have errors
    (:func:`check_run` refuses them).
    """
    if not any(o.lstrip("+~").startswith("hydra.mode=") for o in overrides):
        overrides = [*overrides, "hydra.mode=RUN"]  # as Hydra's single run adds it
    return plan_job(overrides, Environment.detect(), config_dir, freeze=frozen_for_run)


def check_run(job: Job, composed: Composed, plan: Plan) -> Checked:
    """Refuse a plan with errors, then run the preflight I/O checks; the run as Hydra will be handed it."""
    preflight_job(plan)
    run_dir = Path(run_output_dir(job.hydra_config))
    return Checked(run_dir=run_dir, hydra_config=job.hydra_config, config=composed.config, plan=plan)


def preflight_job(plan: Plan) -> None:
    """The checks after planning: no plan errors, no refused import, blocks the workers load, the data's storage (and Ray) reachable."""
    plan.raise_for_errors()
    with collection_paused():  # a block's import path may import torch and Lightning
        refuse_objects(plan.blocks.values())
    if uses_ray(plan) or needs_launcher(plan):
        refuse_blocks_workers_cannot_load(plan.blocks)
    plan.data.preflight()  # I/O the pure plan does not do
    if uses_ray(plan):
        from blocks.launch.ray_workers import preflight

        preflight(plan)  # can the Ray cluster place the workers?


def _checked(
    config: DictConfig, choices: dict[str, str], run_dir: Path, environment: Environment | None = None
) -> tuple[DictConfig, Plan]:
    """The frozen config and its plan, refused when the plan has errors or a path it names is unsafe.

    The hardware is detected here, once per job (*environment* overrides it): the plan and
    ``plan.json`` record it, and workers train with it instead of detecting their own. Also
    runs the data's own preflight (is its storage reachable?). Writes nothing to the run dir.
    """
    frozen = freeze_config(config, run_dir)
    blocks = config_to_blocks(frozen)
    refuse_interpolated_paths(frozen, blocks)  # as `blocks run` does before Hydra starts the job
    plan = plan_blocks(blocks, choices, environment or Environment.detect(), config=frozen)
    preflight_job(plan)
    return frozen, plan


@dataclass(frozen=True)
class Written:
    """The job files a driver wrote into its run dir.

    Attributes:
        plan: the plan written: that of a finished run's recorded display settings when a
            rerun that trains nothing changed only those (:func:`refuse_rewriting_finished`).
        config_text: the text of the ``config.yaml`` written; this node's workers check that
            they train with it (:func:`launch`).
    """

    plan: Plan
    config_text: str


def _write_job_files(run_dir: Path, frozen: DictConfig, plan: Plan, *, in_sweep: bool = False) -> Written:
    """Refuse an unusable resume or checkpoint storage, then write ``config.yaml`` and ``plan.json``.

    An earlier run's ``summary.json`` goes first (:func:`retire_summary`): from here on the run
    dir describes this attempt. A job of a sweep (*in_sweep*) resumes under ``auto`` only a
    checkpoint of its own settings (see :func:`resolve_resume`).
    """
    directory = job_checkpoint_dir(run_dir, plan)
    previous = read_start(run_dir)  # the run dir's last job, before record_start replaces it
    resume_from = resolve_resume(
        plan, directory, previous=previous, recorded=recorded_config(run_dir), in_sweep=in_sweep
    )
    finished = _finished_at(resume_from, plan.derived.total_steps) if resume_from else None
    if finished is not None:
        steps, at = finished
        per_epoch = plan.derived.steps_per_epoch
        frozen, kept = refuse_rewriting_finished(
            run_dir, frozen, steps, stopped_at=at, steps_per_epoch=per_epoch
        )
        if kept:
            plan = dataclasses.replace(plan, blocks=config_to_blocks(frozen))  # no derived number reads them
            print(
                f"blocks: the run in {run_dir} {finished_how(steps, at)} and {', '.join(kept)} "
                "change no weights: it runs again with the values its config.yaml records and trains "
                f"nothing (give a new hydra.run.dir, or {how_to_train_further(frozen, steps, per_epoch)}, "
                "to train with the new values)",
                flush=True,
            )
    if plan.checkpoint.enabled:
        preflight_storage(directory, plan.derived.world_size)
        refuse_foreign_in_the_way(plan, directory, resume_from)
    upgraded = _upgraded_blocks(plan, resume_from) if resume_from else []
    retire_summary(run_dir)
    text = write_job_files(run_dir, frozen, plan)
    if plan.checkpoint.enabled:
        # every node's driver of a multi-node job records the same job: its SLURM job, if any
        nonce = None if plan.derived.nodes == 1 or uses_ray(plan) else os.environ.get("SLURM_JOB_ID", "")
        record_start(run_dir, directory, resume_from, OmegaConf.to_yaml(frozen), nonce)
    if resume_from:
        print(f"blocks: {resume_message(resume_from)}", flush=True)
    for note in upgraded:  # Hydra's job log: the console and the run dir's blocks.log
        log.warning("%s", note)
    return Written(plan, text)


def _upgraded_blocks(plan: Plan, resume_from: str) -> list[str]:
    """A line per kind whose block the checkpoint *resume_from* was trained with at another version than the installed one.

    The checkpoint's own record, else its run's (:func:`~blocks.runtime.model_export.recorded_packages`).
    """
    from blocks.runtime.model_export import recorded_packages

    try:
        recorded = recorded_packages(resume_from, resume_from)
    except BlocksError:  # a checkpoint of an older blocks outside any run dir: nothing recorded
        return []
    return version_notes(recorded, plan.blocks, what="the checkpoint resumed was trained with", lead="")


def _finished_at(resume_from: str, total_steps: int) -> tuple[int, int] | None:
    """The steps the run that saved *resume_from* was given and the step it ended at, when resuming it trains nothing.

    Nothing is trained from a checkpoint at the run's last step (*total_steps*), nor from one a
    callback stopped early while the run gets no more steps than it was given then. None: the
    resume trains on.
    """
    step = read_manifest(resume_from).step
    if step >= total_steps:
        return total_steps, step
    stopped_of = stopped_early_of(resume_from)
    return (stopped_of, step) if stopped_of is not None and total_steps <= stopped_of else None


@contextlib.contextmanager
def held(
    run_dir: Path,
    config: DictConfig,
    choices: dict[str, str],
    checked: Checked | None = None,
    sweep_job: SweepJob | None = None,
) -> Iterator[Written]:
    """Check the job, lock its run dir (and checkpoint dir), write its job files; locked until the block ends.

    A plan with errors is refused before the lock is taken; a run dir or checkpoint dir held
    by a live job, or a resume or storage that cannot work, is refused before anything is
    written. The drivers of a multi-node job under torchrun, one per node, share their run
    dir: they share its locks too, as the job their rendezvous names (:func:`multi_node_job`),
    and any other job is refused as a single-node one is (under Ray one driver starts every
    node's workers, and locks alone). A *checked* run for this run dir is not planned again. A job of a sweep (*sweep_job*) is
    refused a run dir that holds another job (:meth:`SweepJob.claim`): it would resume that
    job's checkpoints and replace its files.
    """
    if checked is not None and checked.run_dir == run_dir:
        frozen, plan = checked.config, checked.plan
    else:
        frozen, plan = _checked(config, choices, run_dir)
    job = None
    if plan.derived.nodes > 1 and not uses_ray(plan):
        rendezvous_settings(plan)
        job = multi_node_job(run_dir)
    with contextlib.ExitStack() as locks:
        locks.enter_context(locked(run_dir, job))
        if locks_checkpoint_dir(run_dir, plan):
            locks.enter_context(checkpoint_dir_locked(job_checkpoint_dir(run_dir, plan), run_dir, job))
        identity = sweep_job.claim(run_dir, frozen, dict(plan.choices)) if sweep_job is not None else None
        written = _write_job_files(run_dir, frozen, plan, in_sweep=sweep_job is not None)
        if sweep_job is not None and identity is not None:
            sweep_job.record(run_dir, identity)
        yield written


def job_checkpoint_dir(run_dir: Path, plan: Plan) -> str:
    """Where the job in *run_dir* saves its checkpoints: ``checkpoint.dir``, else ``checkpoints/`` in the run dir."""
    return checkpoint_dir(plan, default=str(run_dir / CHECKPOINTS_DIR))


def locks_checkpoint_dir(run_dir: Path, plan: Plan) -> bool:
    """Whether the job in *run_dir* locks its checkpoint dir besides its run dir.

    It does when it saves or resumes checkpoints where another job could too: anywhere but in
    ``memory://`` (one process's own), the default ``checkpoints/`` of its run dir included
    (another job's ``checkpoint.dir`` may name it). A URL no file system opens (s3:// without
    s3fs) is left to the storage check to refuse.
    """
    if not plan.checkpoint.enabled:
        return False
    try:
        fs, _ = url_to_fs(job_checkpoint_dir(run_dir, plan))
    except Exception:
        return False
    return not isinstance(fs, MemoryFileSystem)


def launch(run_dir: Path, plan: Plan | None = None, config_text: str | None = None) -> Summary:
    """Train the run in *run_dir*: in this process, through torchrun for several processes or restarts, or on Ray.

    *config_text* is the ``config.yaml`` this driver wrote: torchrun's workers are given it and
    refuse to train when a rank's differs (another node's driver wrote another config).

    An earlier run's ``summary.json`` is taken away first (:func:`retire_summary`). A run that
    dies without writing one (a crash before training) still gets one, with status ``failed``
    (``interrupted`` after a signal); a killed ``blocks run`` leaves none. Raises
    :class:`JobFailed` when the run did not complete.
    """
    plan = plan or load_plan(run_dir)
    on_ray = uses_ray(plan)
    retire_summary(run_dir)
    if on_ray or needs_launcher(plan):
        drop_kept()  # the state the resume's checks loaded: the workers load it themselves
        for stale in (FAILURES_FILE, ATTEMPT_FILE):
            (run_dir / stale).unlink(missing_ok=True)
        shutil.rmtree(run_dir / RANKS_DIR, ignore_errors=True)
        stopped_by = None
        if on_ray:
            from blocks.launch.ray_workers import run_ray

            code = run_ray(run_dir, plan)
        else:
            code, stopped_by = run_torchrun(run_dir, plan, config_text)
        if code == 0 and plan.derived.nodes > 1 and not on_ray:
            _await(run_dir / SUMMARY_FILE, timeout_s=SUMMARY_WAIT_S)  # global rank 0 may run on another node
        if not (run_dir / SUMMARY_FILE).exists():
            # A signal passed on before any worker wrote a summary interrupted the job, whatever
            # torchrun's status: one arriving while its interpreter starts ends it with status 1.
            interrupted = code == EXIT_INTERRUPTED or stopped_by is not None
            code = EXIT_INTERRUPTED if interrupted else code
            steps = trained_steps(run_dir, plan)
            if interrupted:
                reason = interrupted_before_summary(stopped_by, steps, saved_step(run_dir, plan))
            elif code == EXIT_NO_RENDEZVOUS and not on_ray:
                reason = no_rendezvous(plan)
            else:
                reason = f"worker processes exited with status {code} without a summary"
            Summary(
                status="interrupted" if interrupted else "failed",
                reason=reason,
                world_size=plan.derived.world_size,
                restarts=restarts_done(run_dir),
                global_step=steps,
            ).write(run_dir)
        summary = Summary.read(run_dir)
        dead = dead_ranks(run_dir)
        if summary.status == "failed" and dead:
            summary.reason = f"{dead}; the other ranks failed with: {summary.reason}"
            summary.write(run_dir)
        if code not in (0, EXIT_INTERRUPTED) or summary.status != "completed":
            raise JobFailed(f"the job ended with status '{summary.status}': {summary.reason}", summary)
        return summary

    with collection_paused():
        from pytorch_lightning.utilities.exceptions import SIGTERMException

        from blocks.launch.worker import train

    try:
        with environment_restored():
            return train(run_dir)
    except BaseException as exc:
        if not (run_dir / SUMMARY_FILE).exists():
            signal_name = {KeyboardInterrupt: "SIGINT", SIGTERMException: "SIGTERM"}.get(type(exc))
            if signal_name is not None:  # a signal while the run was still being built
                steps = trained_steps(run_dir, plan)
                reason = interrupted_before_summary(
                    signal_name, steps, saved_step(run_dir, plan), starting=True
                )
                Summary(
                    status="interrupted", reason=reason, world_size=plan.derived.world_size, global_step=steps
                ).write(run_dir)
            else:
                Summary(status="failed", reason=f"{type(exc).__name__}: {exc}").write(run_dir)
        from blocks.runtime.health import STALL_EXIT_CODE, NonFiniteError, StallError

        if isinstance(exc, (NonFiniteError, StallError, SIGTERMException, KeyboardInterrupt, SystemExit)):
            # the run's health policy, its stall watchdog or a signal stopped it: no traceback
            summary = Summary.read(run_dir)
            raise JobFailed(
                f"the job ended with status '{summary.status}': {summary.reason}",
                summary,
                exit_status=STALL_EXIT_CODE if isinstance(exc, StallError) else None,
            ) from None
        raise
    finally:
        drop_kept()  # a run that ended before its load took the state the resume's checks kept


def interrupted_before_summary(
    signal_name: str | None, steps: int, saved: int | None = None, *, starting: bool = False
) -> str:
    """``summary.json``'s reason for workers a signal (*signal_name*, when known) stopped before any wrote a summary.

    torchrun may not have started them yet: it was importing, or waiting at the rendezvous for
    the other nodes. *starting*: the run trains in this process and was still being set up.
    *steps*: the optimizer steps the job got through (:func:`trained_steps`); *saved*: the step
    of its newest checkpoint (:func:`saved_step`), None when it has none.
    """
    where = (
        "(it was still being set up)"
        if starting
        else "(torchrun may still have been starting them, or waiting for the other nodes)"
    )
    stopped = f"{signal_name or 'a signal'} stopped the job before {'it' if starting else 'its workers'} wrote a summary {where}"
    again = "run the same command, with the same run dir,"
    if saved is not None:
        return f"{stopped}, at step {steps}: its checkpoint of step {saved} stays; {again} to resume from it"
    if steps == 0:
        return f"{stopped}: nothing was trained or saved; {again} to start it"
    return f"{stopped}, at step {steps}, with no checkpoint saved: {again} to start it again"


RUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "PL_GLOBAL_SEED", "PL_SEED_WORKERS")
"""What Lightning writes into ``os.environ`` for a run: seeding, and a one-process DDP or FSDP group's address."""


@contextlib.contextmanager
def environment_restored() -> Iterator[None]:
    """:data:`RUN_VARIABLES` as they were before the block: a run in this process leaves none behind.

    A later run, or a process started from here, would inherit them (a stale ``MASTER_PORT``
    points a new process group at a port nobody listens on).
    """
    saved = {name: os.environ.get(name) for name in RUN_VARIABLES}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def restarts_done(run_dir: Path) -> int:
    """How many times torchrun restarted the workers (their last attempt's number)."""
    try:
        return int((run_dir / ATTEMPT_FILE).read_text())
    except (OSError, ValueError):
        return 0


def trained_steps(run_dir: Path, plan: Plan) -> int:
    """Optimizer steps a run without a summary got through: its newest checkpoint's, else metrics.csv's last step.

    Only the job's own checkpoints count, those it saved or continues (its recorded start's
    candidates): another run's in the same directory tell nothing of this job's progress. So
    do only metrics.csv rows written since the job started (an earlier run's say nothing).
    """
    saved = saved_step(run_dir, plan)
    if saved is not None:
        return saved
    with contextlib.suppress(Exception):
        if (run_dir / METRICS_FILE).stat().st_mtime < (run_dir / START_FILE).stat().st_mtime:
            return 0
    with contextlib.suppress(Exception), (run_dir / METRICS_FILE).open(newline="") as fh:
        steps = [int(row["step"]) for row in csv.DictReader(fh)]
        return steps[-1] if steps else 0
    return 0


def saved_step(run_dir: Path, plan: Plan) -> int | None:
    """The step of the job's newest committed checkpoint (one it saved or continues), None when it has none."""
    from blocks.checkpoint import store

    with contextlib.suppress(Exception):
        newest = store.newest_valid(job_checkpoint_dir(run_dir, plan), read_start(run_dir).candidates())
        if newest is not None:
            return int(newest.manifest.step)
    return None


NEVER_EXITED = (
    "never exited: a signal ended it (SIGKILL from the OOM killer or from torchrun stopping a rank "
    "that did not respond, or a crash)"
)


def dead_ranks(run_dir: Path) -> str | None:
    """Which ranks a signal killed ("rank 1 died (SIGKILL)"), else None.

    torchrun reports the first failure it notices: the killed rank, or a peer that exited
    first on its broken connection. Ranks of the last attempt that never exited are named
    too (:func:`~blocks.launch.worker.vanished_ranks`), with the signal when torchrun saw it.
    """
    deaths = {
        str(f["rank"]): f"died ({f['signal']})"
        for f in read_failures(run_dir)
        if f.get("signal") not in (None, "<N/A>")
    }
    for rank in vanished_ranks(run_dir, restarts_done(run_dir)):
        deaths.setdefault(str(rank), NEVER_EXITED)
    if not deaths:
        return None
    return ", ".join(f"rank {rank} {how}" for rank, how in deaths.items())


SUMMARY_WAIT_S = 300.0


def _await(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.5)


class JobFailed(RuntimeError):
    """The workers of a job failed or were interrupted; ``summary`` says how, ``exit_status`` is ``blocks run``'s."""

    def __init__(self, message: str, summary: Summary, *, exit_status: int | None = None) -> None:
        super().__init__(message)
        self.summary = summary
        self.exit_status = exit_code(summary) if exit_status is None else exit_status


def prepare(overrides: list[str], run_dir: Path, environment: Environment | None = None) -> Plan:
    """Compose *overrides*, plan, and write the run dir's job files; raises on config mistakes.

    The Python twin of ``blocks run`` up to the point where training starts. *environment*
    replaces the detected hardware in the frozen plan (what workers will train with).
    """
    composed = compose(overrides)
    frozen, plan = _checked(composed.config, composed.choices, run_dir, environment)
    try:
        return _write_job_files(run_dir, frozen, plan).plan
    finally:
        drop_kept()  # nothing trains here: the state the resume's checks kept is not loaded


def run(overrides: list[str], run_dir: Path) -> Summary:
    """Compose, plan and train one job, writing its run dir (no Hydra job): the Python ``blocks run``."""
    composed = compose(overrides)
    with held(run_dir, composed.config, composed.choices) as written:
        return launch(run_dir, written.plan, written.config_text)
