"""The files of a run dir (DESIGN.md contract): what the driver writes and workers read back."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from blocks.core.compose import config_to_blocks
from blocks.core.plan import Plan, make_plan
from blocks.core.run_files import (  # noqa: F401  (the run-dir contract, re-exported for launch)
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    PLAN_FILE,
    SUMMARY_FILE,
    WEIGHTS_FILE,
    Status,
    Summary,
)
from blocks.core.secrets import keep_env_in_plan, resolve_keeping_env


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
    """Rebuild the plan from a run dir's ``config.yaml`` (and the choices in ``plan.json``)."""
    config = OmegaConf.load(run_dir / CONFIG_FILE)
    assert isinstance(config, DictConfig)
    choices: dict[str, str] = {}
    plan_file = run_dir / PLAN_FILE
    if plan_file.exists():
        choices = json.loads(plan_file.read_text()).get("choices", {})
    return make_plan(config_to_blocks(config), choices or None)
