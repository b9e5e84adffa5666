"""The driver: what ``blocks run`` does inside each Hydra job.

Hydra composes the config and picks the run dir (one per job, also in sweeps). The driver
plans the job, freezes ``config.yaml`` and ``plan.json`` into the run dir, and trains: in
its own process for one process, through torchrun for several (or when restarts are asked for).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from blocks.checkpoint.resume import checkpoint_dir, resolve_resume, resume_message
from blocks.checkpoint.storage import preflight_storage
from blocks.core import catalog
from blocks.core.compose import config_to_blocks
from blocks.core.errors import BlocksError
from blocks.core.imports import refuse_objects
from blocks.core.jobs import compose
from blocks.core.plan import Plan, make_plan
from blocks.launch.run_dir import (
    CHECKPOINTS_DIR,
    SUMMARY_FILE,
    Summary,
    freeze_config,
    load_plan,
    write_job_files,
)
from blocks.launch.torchrun import needs_launcher, run_torchrun


def run_job(cfg: DictConfig) -> float | None:
    """The Hydra task function: plan, write the run dir, train. Returns ``monitor.objective`` for sweepers."""
    from hydra.core.hydra_config import HydraConfig

    catalog.load()  # launcher plugins (joblib, submitit) run jobs in fresh processes
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    choices = {
        str(k): str(v) for k, v in hydra_cfg.runtime.choices.items() if not str(k).startswith("hydra/")
    }
    try:
        plan = _write_and_check(cfg, choices, run_dir)
        summary = launch(run_dir, plan)
    except JobFailed as exc:
        print(f"blocks: {exc} (run dir: {run_dir})", file=sys.stderr)
        raise SystemExit(1) from None
    except BlocksError as exc:
        print(f"blocks: the job could not start (run dir: {run_dir})", file=sys.stderr)
        for problem in exc.problems:
            print(problem.render(), file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    return objective(plan, summary)


def objective(plan: Plan, summary: Summary) -> float | None:
    """The value a sweeper optimizes: ``monitor.objective``, else ``train/loss`` (None when the run has neither)."""
    name = str(getattr(plan.monitor, "objective", "val/loss"))
    value = summary.metrics.get(name, summary.metrics.get("train/loss"))
    return None if value is None else float(value)


def _write_and_check(config: DictConfig, choices: dict[str, str], run_dir: Path) -> Plan:
    """Freeze and write the job files, then refuse a broken plan or an unusable resume before any process starts."""
    frozen = freeze_config(config, run_dir)
    plan = make_plan(config_to_blocks(frozen), choices)
    if plan.ok:
        refuse_objects(plan.blocks.values())  # before the run dir is written
    write_job_files(run_dir, frozen, plan)
    plan.raise_for_errors()
    plan.data.preflight()  # I/O the pure plan does not do: is the data's storage reachable?
    directory = checkpoint_dir(plan, default=str(run_dir / CHECKPOINTS_DIR))
    resume_from = resolve_resume(plan, directory)
    if getattr(plan.checkpoint, "enabled", False):
        preflight_storage(directory, plan.derived.world_size)
    if resume_from:
        print(f"blocks: {resume_message(resume_from)}", flush=True)
    return plan


def launch(run_dir: Path, plan: Plan | None = None) -> Summary:
    """Train the run in *run_dir*: in this process, or through torchrun for several processes or restarts.

    A run that dies without writing ``summary.json`` (a crash before training, a killed
    process) still gets one, with status ``failed``.
    """
    plan = plan or load_plan(run_dir)
    if needs_launcher(plan):
        (run_dir / SUMMARY_FILE).unlink(missing_ok=True)
        code = run_torchrun(run_dir, plan)
        if code == 0 and plan.derived.nodes > 1:
            _await(run_dir / SUMMARY_FILE, timeout_s=SUMMARY_WAIT_S)  # global rank 0 may run on another node
        if not (run_dir / SUMMARY_FILE).exists():
            Summary(
                status="failed",
                reason=f"worker processes exited with status {code} without a summary",
                world_size=plan.derived.world_size,
                restarts=getattr(plan.trainer, "max_failures", 0),
            ).write(run_dir)
        summary = Summary.read(run_dir)
        if code != 0 or summary.status != "completed":
            raise JobFailed(f"the job ended with status '{summary.status}': {summary.reason}", summary)
        return summary

    from blocks.launch.worker import train

    try:
        return train(run_dir)
    except BaseException as exc:
        if not (run_dir / SUMMARY_FILE).exists():
            Summary(status="failed", reason=f"{type(exc).__name__}: {exc}").write(run_dir)
        from blocks.build.health import NonFiniteError

        if isinstance(exc, NonFiniteError):  # the run's health policy stopped it: no traceback
            summary = Summary.read(run_dir)
            raise JobFailed(
                f"the job ended with status '{summary.status}': {summary.reason}", summary
            ) from None
        raise


SUMMARY_WAIT_S = 300.0


def _await(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.5)


class JobFailed(RuntimeError):
    """The workers of a job failed or were interrupted; ``summary`` says how."""

    def __init__(self, message: str, summary: Summary) -> None:
        super().__init__(message)
        self.summary = summary


def prepare(overrides: list[str], run_dir: Path) -> Plan:
    """Compose *overrides*, plan, and write the run dir's job files; raises on config mistakes.

    The Python twin of ``blocks run`` up to the point where training starts.
    """
    composed = compose(overrides)
    return _write_and_check(composed.config, composed.choices, run_dir)


def run(overrides: list[str], run_dir: Path) -> Summary:
    """Compose, plan and train one job, writing its run dir (no Hydra job): the Python ``blocks run``."""
    return launch(run_dir, prepare(overrides, run_dir))
