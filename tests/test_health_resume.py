"""A resumed run judges its health as the uninterrupted one: counters, runs of bad steps, divergence.

Each test trains a run in this process, then resumes it from one of its checkpoints the way a
restart does (the run dir copied, the later checkpoints removed, ``checkpoint.resume=auto``)
and compares. Faults are written in by a test callback placed before blocks' own: NaN into a
gradient at chosen optimizer steps, or a logged loss raised from a chosen step on.
"""

from __future__ import annotations

import contextlib
import csv
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch

from blocks.checkpoint import store
from blocks.launch import driver
from blocks.runtime import trainer as runtime_trainer
from tests.conftest import read_summary

pytestmark = pytest.mark.timeout(600)

BASE = [
    "recipe=blobs",
    "monitor.progress=off",
    "trainer.max_epochs=null",
    "trainer.val_every=null",
    "checkpoint.every_n_steps=5",
    "checkpoint.keep_last=10",
]
HEALTH_COLUMNS = ("health/skipped_steps", "health/rollbacks")


class NaNGradients(pl.Callback):
    """Writes NaN into the first gradient at the optimizer steps in *bad* (1-based, as ``global_step`` after them)."""

    def __init__(self, bad: set[int]) -> None:
        self.bad = bad

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if trainer.global_step + 1 in self.bad:
            grad = next(p.grad for p in pl_module.parameters() if p.grad is not None)
            grad.view(-1)[0] = float("nan")


class RaisedLoss(pl.Callback):
    """From optimizer step *from_step* on, the step's reported loss becomes *value* (training itself is unchanged)."""

    def __init__(self, from_step: int, value: float) -> None:
        self.from_step = from_step
        self.value = value

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step >= self.from_step:
            outputs["loss"] = torch.full_like(outputs["loss"], self.value)


@pytest.fixture
def with_fault(monkeypatch: pytest.MonkeyPatch) -> Callable[[pl.Callback], None]:
    """Put a fault-writing callback first in the trainer of every run this test starts."""
    faults: list[pl.Callback] = []
    build_run = runtime_trainer.build_run

    def build_with_fault(*args: Any, **kwargs: Any) -> runtime_trainer.BuiltRun:
        built = build_run(*args, **kwargs)
        built.trainer.callbacks[:0] = faults  # type: ignore[attr-defined]
        return built

    monkeypatch.setattr(runtime_trainer, "build_run", build_with_fault)
    return faults.append


def train(args: list[str], run_dir: Path) -> dict:
    """Train in this process; ``summary.json`` (a failed run's too)."""
    with contextlib.suppress(Exception):  # the summary says why
        driver.run(args, run_dir)
    return read_summary(run_dir)


def resume_copy(run_dir: Path, step: int, into: Path) -> Path:
    """*run_dir* as a restart finds it after dying past *step*: its checkpoints up to *step*, its metrics."""
    shutil.copytree(run_dir, into)
    for checkpoint in (into / "checkpoints").iterdir():
        if int(checkpoint.name.split("-")[1]) > step:
            store.remove(str(checkpoint))
    (into / "summary.json").unlink()
    return into


def completed(summary: dict) -> dict:
    """*summary*, checked to be of a completed run."""
    assert summary["status"] == "completed", summary.get("reason")
    return summary


def metric_rows(run_dir: Path) -> Iterator[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as fh:
        yield from csv.DictReader(fh)


@pytest.mark.parametrize(
    "policy",
    [
        ["monitor.on_nonfinite=skip", "optim.fused=true"],
        ["monitor.on_nonfinite=skip", "optim.fused=false"],
        ["monitor.on_nonfinite=rollback"],
    ],
    ids=["skip-counted-on-the-device", "skip-counted-on-the-host", "rollback"],
)
def test_a_resumed_run_reports_the_skipped_steps_and_rollbacks_of_the_uninterrupted_one(
    tmp_path: Path, with_fault: Callable[[pl.Callback], None], policy: list[str]
) -> None:
    """Bad steps before and after the checkpoint at step 10; step 10's own one is still unread on
    the device when it is saved (rows every 4 steps). Rollbacks at steps 7, 10 and 11 (to the
    checkpoints at 5, 5 and 10); steps 2 and 3 come before any checkpoint, so they are skipped."""
    args = [*BASE, *policy, "trainer.max_steps=12", "monitor.log_every_n_steps=4"]
    with_fault(NaNGradients({2, 3, 7, 10, 11}))
    whole = completed(train(args, tmp_path / "whole"))
    assert whole["metrics"]["health/skipped_steps"] == 5
    if "rollback" in policy[0]:
        assert whole["metrics"]["health/rollbacks"] == 3  # a rollback does not restore the count it had

    resumed_dir = resume_copy(tmp_path / "whole", 10, tmp_path / "resumed")
    resumed = completed(train(args, resumed_dir))
    assert resumed["resumed_from"].endswith(store.step_dir_name(10))
    for column in HEALTH_COLUMNS:
        assert resumed["metrics"].get(column) == whole["metrics"].get(column), column
    last_whole, last_resumed = list(metric_rows(tmp_path / "whole"))[-1], list(metric_rows(resumed_dir))[-1]
    assert last_resumed["step"] == last_whole["step"] == "12"
    for column in HEALTH_COLUMNS:
        assert last_resumed.get(column, "") == last_whole.get(column, ""), column


@pytest.mark.parametrize(
    ("fused", "bad"),
    [("true", {9, 10, 11}), ("false", {9, 10, 11}), ("true", {7, 8, 9})],
    ids=["on-the-device", "on-the-host", "on-the-device-ended-before-the-checkpoint"],
)
def test_a_run_of_bad_steps_across_the_resume_still_counts_against_max_bad_steps(
    tmp_path: Path, with_fault: Callable[[pl.Callback], None], fused: str, bad: set[int]
) -> None:
    """Three bad steps in a row, ``max_bad_steps=2``: the run fails, and so does the run resumed
    from the checkpoint at step 10. Either the run of bad steps goes on past the checkpoint, or
    it ended before it, on the device, where the limit is enforced only at the next logged step
    (12; the host check fails at step 9, before that checkpoint)."""
    args = [*BASE, "monitor.on_nonfinite=skip", f"optim.fused={fused}", "monitor.max_bad_steps=2"]
    args += ["trainer.max_steps=15", "monitor.log_every_n_steps=6"]
    with_fault(NaNGradients(bad))
    whole = train(args, tmp_path / "whole")
    assert whole["status"] == "failed" and "3 optimizer steps in a row" in whole["reason"], whole["reason"]

    resumed = train(args, resume_copy(tmp_path / "whole", 10, tmp_path / "resumed"))
    assert resumed["resumed_from"].endswith(store.step_dir_name(10))
    assert resumed["status"] == "failed", resumed
    assert "3 optimizer steps in a row" in resumed["reason"], resumed["reason"]


def test_a_resumed_run_judges_divergence_by_the_first_steps_loss(
    tmp_path: Path, with_fault: Callable[[pl.Callback], None]
) -> None:
    """From step 7 on the logged loss is raised to the factor × the geometric mean of the losses
    of steps 1 and 6: under the factor × step 1's loss, so the uninterrupted run goes on, but over
    the factor × step 6's loss, the first one a run resumed from step 5 sees."""
    factor = 100.0
    args = [
        *BASE,
        "monitor.log_every_n_steps=1",
        "trainer.max_steps=10",
        f"monitor.loss_divergence_factor={factor}",
    ]
    clean = completed(train(args, tmp_path / "clean"))
    assert "health/divergences" not in clean["metrics"]
    losses = {int(row["step"]): float(row["train/loss"]) for row in metric_rows(tmp_path / "clean")}
    assert losses[6] < 0.99 * losses[1]  # the loss fell, so the two baselines tell the raised loss apart
    raised = factor * math.sqrt(losses[1] * losses[6])

    with_fault(RaisedLoss(from_step=7, value=raised))
    whole = completed(train(args, tmp_path / "whole"))
    assert float(list(metric_rows(tmp_path / "whole"))[-1]["train/loss"]) == pytest.approx(raised)

    resumed_dir = resume_copy(tmp_path / "whole", 5, tmp_path / "resumed")
    resumed = completed(train(args, resumed_dir))
    assert resumed["resumed_from"].endswith(store.step_dir_name(5))
    assert resumed["global_step"] == whole["global_step"] == 10


def test_a_rollback_to_the_checkpoint_a_run_resumed_from_keeps_the_changed_optimizer_settings(
    tmp_path: Path, with_fault: Callable[[pl.Callback], None]
) -> None:
    """A run resumed with another ``optim.lr`` and weight decay rolls back (step 7) to the checkpoint it resumed from.

    Regression: the rollback loaded that checkpoint's optimizer settings with its state, so the
    run trained on with the weight decay of the run that saved it. Now it keeps its own.
    """
    run_dir = tmp_path / "run"
    args = [
        *BASE,
        "optim=adamw",
        "optim.schedule=constant",
        "optim.warmup_steps=0",
        "monitor.log_every_n_steps=1",
    ]
    with_fault(NaNGradients({7}))
    completed(train([*args, "trainer.max_steps=5", "optim.lr=0.001", "optim.weight_decay=0.01"], run_dir))
    changed = [
        "trainer.max_steps=8",
        "optim.lr=0.01",
        "optim.weight_decay=0.1",
        "monitor.on_nonfinite=rollback",
    ]
    resumed = completed(train([*args, *changed], run_dir))
    assert resumed["metrics"]["health/rollbacks"] == 1
    state = torch.load(run_dir / "checkpoints" / store.step_dir_name(8) / "state.pt", weights_only=True)
    (optimizer,) = state["optimizer_states"]
    assert [group["weight_decay"] for group in optimizer["param_groups"]] == [0.1, 0.0]
    assert [group["lr"] for group in optimizer["param_groups"]] == [0.01, 0.01]


def test_a_non_finite_baseline_an_older_checkpoint_saved_is_replaced() -> None:
    """A checkpoint saved before skipped steps were kept out of the baseline may hold a NaN one,
    which judged nothing: the resumed run records a new one instead of keeping it."""
    from blocks.runtime.health import HealthGuard

    guard = HealthGuard("skip", max_bad_steps=0, spike_factor=0, checkpoint_dir=None, divergence_factor=3)
    guard.load_state_dict({"first_loss": math.nan})
    assert guard.state_dict()["first_loss"] is None
    guard.load_state_dict({"first_loss": 2.5})
    assert guard.state_dict()["first_loss"] == 2.5
