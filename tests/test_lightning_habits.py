"""Lightning habits a team brings: callbacks by import path, Trainer knobs, loggers, their own modules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blocks.launch import driver
from tests.conftest import REPO, read_summary, run_cli

pytestmark = pytest.mark.timeout(600)

BLOBS = ["recipe=blobs", "monitor.log_every_n_steps=1", "monitor.progress=off"]
EARLY_STOP = (
    "trainer.callbacks=[{_target_: pytorch_lightning.callbacks.EarlyStopping,"
    " monitor: val/loss, patience: 1, min_delta: 100.0}]"
)


def test_early_stopping_on_val_loss_stops_the_run_and_the_summary_says_so(tmp_path: Path) -> None:
    summary = driver.run([*BLOBS, "trainer.max_steps=20", "trainer.val_every=2", EARLY_STOP], tmp_path)
    assert summary.status == "completed"
    # val/loss "improves" once (from +inf), then never by 100: patience 1 stops at the second validation.
    assert summary.global_step == 4
    assert summary.reason is not None and "stopped early by EarlyStopping at step 4 of 20" in summary.reason
    assert "val/loss" in summary.reason
    assert read_summary(tmp_path)["reason"] == summary.reason


def test_early_stopping_reads_blocks_training_metrics_too(tmp_path: Path) -> None:
    stop = (
        "trainer.callbacks=[{_target_: pytorch_lightning.callbacks.EarlyStopping,"
        " monitor: train/loss, patience: 1, min_delta: 100.0, check_on_train_epoch_end: false}]"
    )
    summary = driver.run([*BLOBS, "trainer.max_steps=20", "trainer.val_every=3", stop], tmp_path)
    assert summary.global_step == 6 and "train/loss" in (summary.reason or "")


def test_a_teams_own_callback_runs_with_its_arguments(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    out = tmp_path / "steps.json"
    callback = f"trainer.callbacks=[{{_target_: tests.lightning_habits.StepLog, path: '{out}', tag: ours}}]"
    summary = driver.run([*BLOBS, "trainer.max_steps=3", callback], tmp_path / "run")
    assert summary.status == "completed" and summary.reason is None
    assert json.loads(out.read_text()) == {"tag": "ours", "steps": [1, 2, 3]}


@pytest.mark.parametrize(
    "override",
    [
        "trainer.callbacks=[{_target_: os.system, command: touch pwned}]",
        "monitor.loggers=[os.system]",
        "trainer.callbacks=[{_target_: tests.lightning_habits.not_a_callback}]",
        "trainer.callbacks=[{_target_: tests.lightning_habits.StepLog, path: {_target_: os.system}}]",
    ],
)
def test_code_that_is_no_callback_is_refused_before_anything_starts(override: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_cli(
        ["run", *BLOBS, "trainer.max_steps=2", override, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env={"BLOCKS_ALLOW_IMPORTS": "tests", "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2, result.output
    assert not run_dir.exists() and not (tmp_path / "pwned").exists()
    assert "trainer.callbacks" in result.output or "monitor.loggers" in result.output
    assert "Traceback" not in result.output


def test_trainer_knobs_reach_lightning(tmp_path: Path) -> None:
    knobs = [
        "trainer.max_steps=null",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "trainer.gradient_clip_algorithm=value",
        "optim.grad_clip=0.5",
        "trainer.profiler=simple",
        "trainer.detect_anomaly=true",
    ]
    summary = driver.run([*BLOBS, *knobs], tmp_path)
    assert summary.status == "completed"
    assert summary.global_step == 4, "two epochs of two optimizer steps"
    assert json.loads((tmp_path / "plan.json").read_text())["derived"]["total_steps"] == 4
    assert "val/loss" in summary.metrics
    reports = list((tmp_path / "profiler").iterdir())
    assert reports and "run_training_epoch" in "".join(p.read_text() for p in reports)
