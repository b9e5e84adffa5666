"""The files of a run dir (DESIGN.md contract): what the driver writes and workers read back."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf

from blocks.core.compose import config_to_blocks
from blocks.core.errors import BlocksError, Problem
from blocks.core.plan import Plan
from blocks.core.secrets import keep_env_in_plan, resolve_keeping_env

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
CHECKPOINTS_DIR = "checkpoints"
WEIGHTS_FILE = "model.safetensors"

Status = Literal["completed", "failed", "interrupted"]


def freeze_config(config: DictConfig, run_dir: Path) -> DictConfig:
    """The config as the run will use it: resolved (values from the environment stay ``${oc.env:...}``), with run-dir defaults filled in."""
    frozen = resolve_keeping_env(config)
    if frozen.checkpoint.get("dir", None) is None and "dir" in frozen.checkpoint:
        frozen.checkpoint.dir = str((run_dir / CHECKPOINTS_DIR).resolve())
    return frozen


def write_job_files(run_dir: Path, config: DictConfig, plan: Plan) -> None:
    """Write ``config.yaml`` and ``plan.json``: enough for any worker to rebuild the run."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(config))
    (run_dir / PLAN_FILE).write_text(json.dumps(keep_env_in_plan(plan.to_json(), config), indent=2) + "\n")


def load_plan(run_dir: Path) -> Plan:
    """The plan the driver froze into *run_dir*: blocks from ``config.yaml``, everything else from ``plan.json``.

    Nothing is planned again and no hardware is detected: a worker trains with the derived
    numbers and the environment the driver planned against, even when its own machine differs.
    """
    config = OmegaConf.load(run_dir / CONFIG_FILE)
    assert isinstance(config, DictConfig)
    plan_file = run_dir / PLAN_FILE
    if not plan_file.exists():
        raise BlocksError(
            Problem(
                "run_dir",
                f"{run_dir} has no {PLAN_FILE}: it was not prepared by blocks run",
                "start the run with blocks run (or blocks.launch.driver.prepare) so the plan is frozen",
            )
        )
    frozen = json.loads(plan_file.read_text())
    return Plan.thawed(config_to_blocks(config), frozen)


@dataclass
class Summary:
    """``summary.json``: how a run ended (written at the end, also on failure).

    Attributes:
        status: completed, failed or interrupted.
        reason: why it failed or was interrupted; for a completed run, why it stopped before
            ``total_steps`` (an EarlyStopping callback), else null.
        global_step: optimizer steps taken.
        epoch: full passes over the training split completed.
        world_size: processes that trained.
        restarts: times the job was restarted after a failure.
        resumed_from: checkpoint URL the run resumed from, or null.
        metrics: the last value of every metric by name (``train/loss``, ``val/loss``, ...).
        samples_per_s: training samples per second over the whole run, warm-up, validation and
            checkpoint stalls included (total samples / training seconds).
        steady_samples_per_s: training samples per second in the steady state: every logged
            window after the first (warm-up), without the time spent in validation and checkpoint
            saves; null when fewer than two windows were logged.
        steady_tokens_per_s: the same in tokens per second (token data only, else null).
        wall_s: seconds from the start of the worker to the end.
        state_digest: sha256 of the final weights (see ``blocks.build.digest``).
        checkpoint_stall_s: seconds training waited for checkpoint saves (with
            ``checkpoint.async_save``, only for the copies to host memory).
    """

    status: Status
    reason: str | None = None
    global_step: int = 0
    epoch: int = 0
    world_size: int = 1
    restarts: int = 0
    resumed_from: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    samples_per_s: float = 0.0
    steady_samples_per_s: float | None = None
    steady_tokens_per_s: float | None = None
    wall_s: float = 0.0
    state_digest: str | None = None
    checkpoint_stall_s: float = 0.0

    def write(self, run_dir: Path) -> None:
        """Write ``summary.json`` atomically (a reader never sees half a file)."""
        path = run_dir / SUMMARY_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def read(cls, run_dir: Path) -> Summary:
        """Read a run dir's ``summary.json``."""
        data: dict[str, Any] = json.loads((run_dir / SUMMARY_FILE).read_text())
        return cls(**data)
