"""The frozen plan: the driver plans once, against the hardware it sees, and workers train with that plan.

A driver on a CPU login node and workers on GPU nodes must not disagree: workers rebuild
from ``config.yaml`` and ``plan.json`` and never plan again or detect their own hardware.
Planning itself is pure; the checks that read storage run as a separate preflight step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from blocks.core import jobs
from blocks.core.environment import Environment
from blocks.core.plan import make_plan, preflight
from blocks.launch import driver
from blocks.launch.run_dir import CONFIG_FILE, PLAN_FILE, load_plan

TINY = ["recipe=blobs", "data.samples=256", "trainer.max_steps=2", "monitor.progress=off"]
EIGHT_GPUS = Environment(gpus=8, gpu_memory_bytes=80 * 2**30, host_memory_bytes=512 * 2**30)


@pytest.fixture(scope="module")
def gpu_planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir whose plan the driver froze as if it saw 8 GPUs (this machine has none)."""
    run_dir = tmp_path_factory.mktemp("frozen") / "run"
    driver.prepare([*TINY, "trainer.accelerator=auto"], run_dir, environment=EIGHT_GPUS)
    return run_dir


def test_plan_json_records_the_environment_the_driver_planned_against(gpu_planned: Path) -> None:
    frozen = json.loads((gpu_planned / PLAN_FILE).read_text())
    assert Environment.from_json(frozen["environment"]) == EIGHT_GPUS
    assert frozen["derived"]["accelerator"] == "gpu"


def test_a_worker_reads_the_frozen_plan_instead_of_planning_on_its_own_machine(gpu_planned: Path) -> None:
    assert Environment.detect().gpus == 0  # planning here would resolve trainer.accelerator=auto to cpu
    plan = load_plan(gpu_planned)
    assert plan.environment == EIGHT_GPUS
    assert plan.derived.accelerator == "gpu"
    assert plan.derived.memory is not None
    assert (plan.derived.memory.device, plan.derived.memory.device_source) == (80 * 2**30, "detected GPU")
    assert plan.derived == make_plan(plan.blocks, plan.choices, EIGHT_GPUS).derived


def test_the_worker_trains_with_the_frozen_accelerator(gpu_planned: Path) -> None:
    """The in-process worker builds a GPU trainer from the frozen plan; on this CPU machine Lightning refuses it."""
    with pytest.raises(Exception, match=r"(?i)gpu|cuda"):
        driver.launch(gpu_planned)
    summary = json.loads((gpu_planned / "summary.json").read_text())
    assert summary["status"] == "failed"


def test_a_worker_reads_config_yaml_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker rebuilds its blocks and its loggers' hyperparameters from one read of ``config.yaml``."""
    run_dir = tmp_path / "run"
    plan = driver.prepare(TINY, run_dir)  # as `blocks run` hands its plan to the launch
    load, read_text = OmegaConf.load, Path.read_text
    names: list[str] = []

    def counted(file_: str | Path, *args: object, **kwargs: object) -> object:
        names.append(Path(file_).name)
        return load(file_, *args, **kwargs)

    def counted_text(path: Path, *args: object, **kwargs: object) -> str:
        names.append(path.name)
        return read_text(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(OmegaConf, "load", counted)
    monkeypatch.setattr(Path, "read_text", counted_text)
    assert driver.launch(run_dir, plan).status == "completed"
    assert names.count(CONFIG_FILE) == 1


def test_a_run_dir_without_a_frozen_plan_is_refused(tmp_path: Path) -> None:
    from blocks.spec.errors import BlocksError

    (tmp_path / "config.yaml").write_text("{}\n")
    with pytest.raises(BlocksError, match=r"plan\.json"):
        load_plan(tmp_path)


def test_planning_is_pure_and_the_resume_url_is_a_preflight_check() -> None:
    missing = "memory://blocks-frozen-plan/no-checkpoint"
    blocks = jobs.blocks_for([*TINY, f"checkpoint.resume={missing}"])
    pure = make_plan(blocks, None, Environment())
    assert "resume-committed" not in {p.check for p in pure.problems}
    checked = preflight(pure)
    assert [p.key for p in checked.errors if p.check == "resume-committed"] == ["checkpoint.resume"]
    assert "resume-committed" in {p.check for p in jobs.plan([*TINY, f"checkpoint.resume={missing}"]).errors}
