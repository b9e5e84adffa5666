"""A run dir's ``summary.json`` describes the latest attempt: an earlier outcome never stands in for it.

One finished run is copied for every case: extended and killed, extended with weights that cannot
be written, extended with a logger that cannot start, and run again with nothing left to train
(unchanged, changed, changed in display keys only, and with a field its config.yaml lacks).
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from blocks.launch import driver
from blocks.launch.run_dir import FinishedRunKept
from tests.conftest import blocks_run_until_step, read_summary, run_in_process

pytestmark = pytest.mark.timeout(600)

ARGS = [
    "recipe=blobs",
    "trainer.max_epochs=null",
    "trainer.val_every=null",
    "checkpoint.every_n_steps=10",
    "monitor.log_every_n_steps=5",
]
QUIET = [*ARGS, "monitor.progress=off"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir of :data:`ARGS` completed at step 20 (checkpoints at 10 and 20, ``model.safetensors``)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert driver.run([*QUIET, "trainer.max_steps=20"], run_dir).status == "completed"
    return run_dir


def copy_of(finished: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    return run_dir


def test_a_rerun_with_nothing_left_to_train_keeps_the_finished_runs_figures(
    finished: Path, tmp_path: Path
) -> None:
    run_dir = copy_of(finished, tmp_path)
    summary = driver.run([*QUIET, "trainer.max_steps=20"], run_dir)
    before, after = read_summary(finished), read_summary(run_dir)
    assert summary.status == after["status"] == "completed" and after["resumed_from"]
    assert after["global_step"] == 20 and after["state_digest"] == before["state_digest"]
    assert after["metrics"]["train/loss"] == before["metrics"]["train/loss"], (
        "the objective of a run without validation"
    )
    for name in ("samples_per_s", "steady_samples_per_s", "checkpoint_stall_s"):
        assert after[name] == before[name], name
    assert before["samples_per_s"] > 0 and before["steady_samples_per_s"] is not None


def test_a_changed_rerun_with_nothing_left_to_train_keeps_the_finished_runs_record(
    finished: Path, tmp_path: Path
) -> None:
    run_dir = copy_of(finished, tmp_path)
    kept = {name: (run_dir / name).read_text() for name in ("config.yaml", "plan.json", "summary.json")}
    args = [
        *QUIET,
        "trainer.max_steps=20",
        f"hydra.run.dir={run_dir}",
        "optim.lr=0.5",
        "monitor.progress=lines",
    ]
    result = run_in_process(["run", *args], cwd=tmp_path)
    assert result.returncode == 2, result.output
    assert "optim.lr: the run in" in result.output and "trained all its 20 steps" in result.output
    assert "with optim.lr changed" in result.output, "a display key is not what refuses it"
    assert "raise trainer.max_steps above 20" in result.output and "Traceback" not in result.output
    assert {name: (run_dir / name).read_text() for name in kept} == kept


def test_a_rerun_changing_only_display_keys_runs_as_the_finished_run_records(
    finished: Path, tmp_path: Path
) -> None:
    run_dir = copy_of(finished, tmp_path)
    kept = (run_dir / "config.yaml").read_text().replace(str(finished), str(run_dir))  # its checkpoints
    args = [*ARGS, "monitor.progress=lines", "monitor.stall_timeout_s=600", "trainer.max_steps=20"]
    result = run_in_process(["run", *args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.output
    assert "monitor.progress, monitor.stall_timeout_s change no weights" in result.output
    assert (run_dir / "config.yaml").read_text() == kept, "it still describes the run that trained"
    shown = json.loads((run_dir / "plan.json").read_text())["blocks"]["monitor"]["fields"]
    assert (shown["progress"], shown["stall_timeout_s"]) == ("off", 0.0)
    after = read_summary(run_dir)
    assert after["status"] == "completed" and after["global_step"] == 20
    assert after["state_digest"] == read_summary(finished)["state_digest"]


def test_a_field_an_older_config_yaml_lacks_is_no_change_at_its_default(
    finished: Path, tmp_path: Path
) -> None:
    run_dir = copy_of(finished, tmp_path)
    recorded = (run_dir / "config.yaml").read_text().replace(str(finished), str(run_dir))
    assert "  detect_anomaly: false\n" in recorded
    # as a version before trainer.detect_anomaly wrote it
    (run_dir / "config.yaml").write_text(recorded.replace("  detect_anomaly: false\n", ""))
    with pytest.raises(FinishedRunKept) as refused:
        driver.run([*QUIET, "trainer.max_steps=20", "trainer.detect_anomaly=true"], run_dir)
    assert refused.value.problems[0].key == "trainer.detect_anomaly"
    assert driver.run([*QUIET, "trainer.max_steps=20"], run_dir).status == "completed"
    assert (run_dir / "config.yaml").read_text() == recorded


def test_a_section_an_older_config_yaml_lacks_or_a_field_it_has_no_more_is_no_change(
    finished: Path, tmp_path: Path
) -> None:
    """A config.yaml of another version: a whole block kind absent, a field since removed: the rerun is accepted."""
    import yaml

    run_dir = copy_of(finished, tmp_path)
    recorded = (run_dir / "config.yaml").read_text().replace(str(finished), str(run_dir))
    older = yaml.safe_load(recorded)
    assert older["strategy"]["_block_"] == "single"
    del older["strategy"]  # as a version before the strategy kind wrote it, every field at its default
    older["trainer"]["retired_knob"] = 3  # a field a later version removed
    (run_dir / "config.yaml").write_text(yaml.safe_dump(older, sort_keys=False))
    with pytest.raises(FinishedRunKept) as refused:
        driver.run([*QUIET, "trainer.max_steps=20", "strategy.compile=true"], run_dir)
    assert refused.value.problems[0].key == "strategy", "a kind the old run lacked, not at its defaults"
    assert driver.run([*QUIET, "trainer.max_steps=20"], run_dir).status == "completed"
    assert read_summary(run_dir)["state_digest"] == read_summary(finished)["state_digest"]


def test_an_extension_killed_midway_leaves_no_completed_summary(finished: Path, tmp_path: Path) -> None:
    run_dir = copy_of(finished, tmp_path)
    args = [*ARGS, "trainer.max_steps=100000", f"hydra.run.dir={run_dir}"]
    with blocks_run_until_step(args, cwd=tmp_path, step=25) as proc:
        proc.kill()  # SIGKILL: nothing runs at death
        proc.wait(timeout=60)
    assert not (run_dir / "summary.json").exists(), (
        "the step-20 run's 'completed' must not stand for this attempt"
    )


def test_weights_that_cannot_be_written_fail_the_summary_too(finished: Path, tmp_path: Path) -> None:
    run_dir = copy_of(finished, tmp_path)
    (run_dir / "model.safetensors").unlink()
    (run_dir / "model.safetensors").mkdir()
    with pytest.raises(IsADirectoryError):
        driver.run([*QUIET, "trainer.max_steps=32"], run_dir)
    summary = read_summary(run_dir)
    assert summary["status"] == "failed" and summary["global_step"] == 32
    assert "model.safetensors" in summary["reason"] and "IsADirectoryError" in summary["reason"]
    assert not list(run_dir.glob(".model.safetensors*")), "the half-written file is gone"
    # Regression: an extended run's whole-run throughput counted only the extension's samples and seconds.
    before = read_summary(finished)
    global_batch = json.loads((run_dir / "plan.json").read_text())["derived"]["global_batch"]
    assert summary["train_s"] > before["train_s"] > 0, "the step-20 run's training seconds are carried"
    assert summary["samples_per_s"] * summary["train_s"] == pytest.approx(32 * global_batch, rel=1e-6)
    assert summary["steady_samples_per_s"] is not None
    # Regression: the last, partial window (steps 31-32 of log_every_n_steps=5) had no grad_norm,
    # and summary.json's grad_norm was step 30's.
    with (run_dir / "metrics.csv").open(newline="") as fh:
        last = list(csv.DictReader(fh))[-1]
    assert last["step"] == "32" and last["grad_norm"]
    assert summary["metrics"]["grad_norm"] == pytest.approx(float(last["grad_norm"]), rel=1e-5)


def test_a_rerun_after_the_final_weights_failed_reports_the_final_checkpoints_metrics(
    finished: Path, tmp_path: Path
) -> None:
    """Regression: the rerun of a run whose final checkpoint committed but whose weights could not be
    written trained nothing and validated nothing, and wrote a completed summary with ``"metrics": {}``
    (no objective for a sweep): the failed summary is no completed one to take the figures from."""
    run_dir = copy_of(finished, tmp_path)
    (run_dir / ".model.safetensors.tmp").mkdir()  # the final weights write fails once
    with pytest.raises(OSError):
        driver.run([*QUIET, "trainer.max_steps=30"], run_dir)
    failed = read_summary(run_dir)
    assert failed["status"] == "failed" and failed["global_step"] == 30
    manifest = json.loads((run_dir / "checkpoints" / "step-000000030" / "MANIFEST.json").read_text())
    assert "train/loss" in manifest["metrics"]
    (run_dir / ".model.safetensors.tmp").rmdir()
    summary = driver.run([*QUIET, "trainer.max_steps=30"], run_dir)
    after = read_summary(run_dir)
    assert summary.status == after["status"] == "completed" and after["global_step"] == 30
    assert after["metrics"] == pytest.approx(manifest["metrics"])
    assert after["metrics"]["train/loss"] == pytest.approx(failed["metrics"]["train/loss"])


def test_an_extension_reports_its_own_metrics_not_the_resumed_checkpoints(
    finished: Path, tmp_path: Path
) -> None:
    """A resume starts from the checkpoint's metrics; its first logged row replaces the training ones,
    a metric it no longer logs (here ``grad_norm``) included."""
    run_dir = copy_of(finished, tmp_path)
    assert "grad_norm" in read_summary(finished)["metrics"]
    driver.run([*QUIET, "trainer.max_steps=25", "monitor.grad_norm=false"], run_dir)
    after = read_summary(run_dir)
    with (run_dir / "metrics.csv").open(newline="") as fh:
        last = list(csv.DictReader(fh))[-1]
    assert after["status"] == "completed" and last["step"] == "25"
    assert after["metrics"]["train/loss"] == pytest.approx(float(last["train/loss"]), rel=1e-5)
    assert "grad_norm" not in after["metrics"], "step 20's, from the checkpoint"


def test_a_logger_that_cannot_start_leaves_a_failed_summary(finished: Path, tmp_path: Path) -> None:
    run_dir = copy_of(finished, tmp_path)
    logger = "{_target_: pytorch_lightning.loggers.CSVLogger, no_such_argument: 1}"
    result = run_in_process(
        [
            "run",
            *QUIET,
            "trainer.max_steps=30",
            f"monitor.loggers=[csv,{logger}]",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "could not start" in result.output, result.output[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "failed" and "no_such_argument" in summary["reason"]


def test_a_summary_a_later_version_wrote_is_read_by_this_one(tmp_path: Path) -> None:
    """Regression: ``Summary.read`` took every key as a field, so a summary.json with a field this version
    does not know (blocks only ever adds them) was a TypeError: a rerun deleted the completed summary it
    should have set aside (its figures lost), and a pipeline ended in a traceback."""
    from blocks.core.run_files import SUMMARY_FILE, Summary
    from blocks.launch.run_dir import completed_before, retire_summary

    written = {**Summary(status="completed", global_step=7, samples_per_s=12.5).shown(), "a_later_field": 1}
    (tmp_path / SUMMARY_FILE).write_text(json.dumps(written))
    assert Summary.read(tmp_path).global_step == 7
    retire_summary(tmp_path)
    kept = completed_before(tmp_path)
    assert kept is not None and kept.samples_per_s == 12.5
