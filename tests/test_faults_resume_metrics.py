"""Exact resume includes the metrics: a resumed run's metrics.csv equals the uninterrupted one, validation included."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from blocks.checkpoint import store
from blocks.launch import driver

pytestmark = pytest.mark.timeout(600)

ARGS = [
    "recipe=blobs",
    "monitor.progress=off",
    "monitor.log_every_n_steps=1",
    "trainer.max_epochs=null",
    "trainer.max_steps=16",
    "trainer.val_every=4",
    "checkpoint.every_n_steps=1",
    "checkpoint.keep_last=20",
]
COMPARED = ("step", "train/loss", "lr", "grad_norm", "val/loss", "val/accuracy")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    assert driver.run(ARGS, run_dir).status == "completed"
    return run_dir


def rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as fh:
        return [{k: r.get(k, "") for k in COMPARED} for r in csv.DictReader(fh)]


@pytest.mark.parametrize(
    "resume_step",
    [9, 10, 8],
    ids=["off-the-val_every-boundary", "two-past-the-boundary", "on-the-boundary"],
)
def test_resumed_metrics_equal_the_uninterrupted_ones(
    uninterrupted: Path, tmp_path: Path, resume_step: int
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted, run_dir)
    for checkpoint in (run_dir / "checkpoints").iterdir():
        if int(checkpoint.name.split("-")[1]) > resume_step:
            store.remove(str(checkpoint))
    summary = driver.run(ARGS, run_dir)
    assert summary.resumed_from and summary.resumed_from.endswith(store.step_dir_name(resume_step))
    expected, got = rows(uninterrupted), rows(run_dir)
    assert [r["step"] for r in got if r["val/loss"]] == [r["step"] for r in expected if r["val/loss"]]
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        assert have["step"] == want["step"]
        for column in COMPARED[1:]:
            if want[column]:
                assert float(have[column]) == pytest.approx(float(want[column]), rel=1e-5), (
                    want["step"],
                    column,
                )
            else:
                assert not have[column], (want["step"], column)
