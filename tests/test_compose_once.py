"""``blocks run`` composes a job once and plans it once (issue 15.4), keeping Hydra's run-dir files.

Counted in this process through the real CLI entry: every composition Hydra makes
(``ConfigLoaderImpl.load_configuration``, which ``hydra.compose``, ``Hydra.get_mode``,
``Hydra.run`` and the sweep launchers all go through) and every plan (``make_plan``, the one
planner ``blocks.core.jobs.plan_blocks`` calls). The wrappers count and call the real functions.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl

from blocks.cli.main import run_captured
from blocks.core import jobs
from blocks.spec.errors import ConfigError

TINY = ["recipe=blobs", "data.samples=64", "trainer.max_epochs=1", "monitor.progress=off"]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often Hydra composed a config and blocks made a plan, from here to the test's end."""
    counted: Counter[str] = Counter()

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counted[name] += 1
            return real(*args, **kwargs)

        return wrapper

    real_load = ConfigLoaderImpl.load_configuration
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counting("compose", real_load))
    monkeypatch.setattr(jobs, "make_plan", counting("plan", jobs.make_plan))
    return counted


@contextlib.contextmanager
def inside(directory: Path) -> Iterator[None]:
    with contextlib.chdir(directory):
        yield


def test_a_single_run_composes_once_and_plans_once(tmp_path: Path, calls: Counter[str]) -> None:
    with inside(tmp_path):
        code, output = run_captured(["run", *TINY])
    assert code == 0, output
    assert calls == {"compose": 1, "plan": 1}, output
    (run_dir,) = (tmp_path / "outputs" / "blobs").iterdir()  # outputs/<recipe>/<timestamp>
    assert f"run dir: {run_dir}" in output
    assert {p.name for p in (run_dir / ".hydra").iterdir()} == {"config.yaml", "hydra.yaml", "overrides.yaml"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["blocks"]["checkpoint"]["fields"]["dir"] == str(run_dir / "checkpoints")
    assert plan["choices"]["recipe"] == "blobs"


def test_run_dir_and_config_dir_still_apply_with_one_composition(tmp_path: Path, calls: Counter[str]) -> None:
    presets = tmp_path / "presets" / "optim"
    presets.mkdir(parents=True)
    (presets / "slow.yaml").write_text("defaults:\n  - adamw\n  - _self_\nlr: 0.0005\n")
    run_dir = tmp_path / "here"
    with inside(tmp_path):
        code, output = run_captured(
            ["run", *TINY, "optim=slow", f"hydra.run.dir={run_dir}", "-cd", str(tmp_path / "presets")]
        )
    assert code == 0, output
    assert calls == {"compose": 1, "plan": 1}, output
    assert not (tmp_path / "outputs").exists()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["blocks"]["optim"]["fields"]["lr"] == 0.0005
    assert (run_dir / ".hydra" / "overrides.yaml").read_text().count("optim=slow") == 1


def test_an_invalid_single_run_is_refused_before_any_run_dir(tmp_path: Path, calls: Counter[str]) -> None:
    with inside(tmp_path):
        code, output = run_captured(["run", *TINY, "data.batch_size=0"])
    assert code == 2, output
    assert "data.batch_size" in output
    assert calls["plan"] == 1
    assert not (tmp_path / "outputs").exists()


def test_each_sweep_job_is_planned_once(tmp_path: Path, calls: Counter[str]) -> None:
    sweep = tmp_path / "sweep"
    with inside(tmp_path):
        code, output = run_captured(["run", "-m", *TINY, "optim.lr=0.01,0.003", f"hydra.sweep.dir={sweep}"])
    assert code == 0, output
    assert calls["plan"] == 2, output  # by the precheck, before any job started; the jobs reuse them
    for job, lr in (("0", 0.01), ("1", 0.003)):
        plan = json.loads((sweep / job / "plan.json").read_text())
        assert plan["blocks"]["optim"]["fields"]["lr"] == lr
        assert plan["blocks"]["checkpoint"]["fields"]["dir"] == str(sweep / job / "checkpoints")
        assert json.loads((sweep / job / "summary.json").read_text())["status"] == "completed"
        assert (sweep / job / ".hydra" / "overrides.yaml").is_file()


def test_unknown_keys_are_named_with_hints_without_an_extra_composition(calls: Counter[str]) -> None:
    """The first failing round names every block key that does not exist, each with its did-you-mean.

    The node that lacked the first key belongs to the config with every group choice applied:
    the other unknown keys are read there, so one round reports them all (was: one composition
    per unknown key), in the order of the command line.
    """
    typos = ["optim.lrr=0.1", "trainer.max_stepz=3", "optim.warmup_stepz=2", "model.hiden=[4]"]
    with pytest.raises(ConfigError) as refused:
        jobs.plan(["recipe=blobs", *typos])
    problems = refused.value.problems
    assert [p.key for p in problems] == [
        "optim.lrr",
        "trainer.max_stepz",
        "optim.warmup_stepz",
        "model.hiden",
    ]
    hints = {p.key: p.message for p in problems}
    assert "did you mean 'lr'" in hints["optim.lrr"]
    assert "did you mean 'max_steps'" in hints["trainer.max_stepz"]
    assert "did you mean 'warmup_steps'" in hints["optim.warmup_stepz"]
    assert "did you mean 'hidden'" in hints["model.hiden"]
    # the failing round and the round that composes; the keys come from OmegaConf's error
    assert calls["compose"] == 2


def test_every_problem_is_reported_however_many_and_however_nested(calls: Counter[str]) -> None:
    """A key under an unknown key (``model.bar.x``) is dropped with it, so the later overrides are
    still checked (was: reporting stopped there); ten wrong values are all named (was: eight)."""
    with pytest.raises(ConfigError) as refused:
        jobs.plan(["recipe=blobs", "model.bar.x=3", "model.qux=4", "optim.lr=abc"])
    assert [p.key for p in refused.value.problems] == ["model.bar", "model.qux", "optim.lr"]

    keys = ["trainer.max_steps", "trainer.seed", "optim.lr", "optim.weight_decay", "data.batch_size"]
    keys += ["data.samples", "data.num_features", "data.num_classes", "data.seed", "data.spread"]
    with pytest.raises(ConfigError) as refused:
        jobs.plan(["recipe=blobs", *(f"{key}=not_a_number" for key in keys)])
    assert [p.key for p in refused.value.problems] == keys
