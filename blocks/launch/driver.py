"""The driver: what ``blocks run`` does inside each Hydra job.

Hydra composes the config and picks the run dir (one per job, also in sweeps). The driver
plans the job, freezes ``config.yaml`` and ``plan.json`` into the run dir, and trains: in
its own process for one process.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from blocks.core.compose import config_to_blocks
from blocks.core.jobs import compose
from blocks.core.plan import Plan, make_plan
from blocks.launch.run_dir import SUMMARY_FILE, Summary, freeze_config, write_job_files


def run_job(cfg: DictConfig) -> float | None:
    """The Hydra task function: plan, write the run dir, train. Returns ``val/loss`` for sweepers."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    choices = {
        str(k): str(v) for k, v in hydra_cfg.runtime.choices.items() if not str(k).startswith("hydra/")
    }
    config = freeze_config(cfg, run_dir)
    plan = make_plan(config_to_blocks(config), choices)
    write_job_files(run_dir, config, plan)
    plan.raise_for_errors()
    summary = launch(run_dir)
    return summary.metrics.get("val/loss")


def launch(run_dir: Path) -> Summary:
    """Train the run in *run_dir*; a failure before training starts still leaves a ``summary.json``."""
    from blocks.launch.worker import train

    try:
        return train(run_dir)
    except BaseException as exc:
        if not (run_dir / SUMMARY_FILE).exists():
            Summary(status="failed", reason=f"{type(exc).__name__}: {exc}").write(run_dir)
        raise


def prepare(overrides: list[str], run_dir: Path) -> Plan:
    """Compose *overrides*, plan, and write the run dir's job files; raises on config mistakes.

    The Python twin of ``blocks run`` up to the point where training starts.
    """
    composed = compose(overrides)
    config = freeze_config(composed.config, run_dir)
    plan = make_plan(config_to_blocks(config), composed.choices)
    plan.raise_for_errors()
    write_job_files(run_dir, config, plan)
    return plan


def run(overrides: list[str], run_dir: Path) -> Summary:
    """Compose, plan and train one job in this process, writing its run dir (no Hydra job)."""
    prepare(overrides, run_dir)
    return launch(run_dir)
