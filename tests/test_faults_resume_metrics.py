"""Exact resume includes the metrics: a resumed run's metrics.csv equals the uninterrupted one, validation included."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import yaml

from blocks.checkpoint import store
from blocks.launch import driver
from tests.conftest import empty_mlflow_database

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


LOGGED = [
    "recipe=blobs",
    "monitor.progress=off",
    "monitor.log_every_n_steps=1",
    "trainer.max_epochs=null",
    "trainer.max_steps=8",
    "trainer.val_every=4",
    "checkpoint.every_n_steps=3",
    "trainer.callbacks=[{_target_: pytorch_lightning.callbacks.LearningRateMonitor}]",
]


@pytest.fixture(scope="module")
def relogged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A run to step 8 with TensorBoard and MLflow, cut back to its checkpoint of step 6 as a ``kill -9`` after
    step 8 leaves it, resumed with another ``optim.lr`` (steps 7 and 8 redone), then run again unchanged."""
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("relogged")
    paths = {"run": root / "run", "mlflow": root / "mlflow.db"}
    empty_mlflow_database(paths["mlflow"])
    loggers = (
        "monitor.loggers=[csv,tensorboard,{_target_: pytorch_lightning.loggers.MLFlowLogger,"
        f" tracking_uri: 'sqlite:///{paths['mlflow']}', experiment_name: relogged}}]"
    )
    assert driver.run([*LOGGED, loggers], paths["run"]).status == "completed"
    for checkpoint in (paths["run"] / "checkpoints").iterdir():
        if int(checkpoint.name.split("-")[1]) > 6:
            store.remove(str(checkpoint))
    (paths["run"] / "summary.json").unlink()
    resumed = driver.run([*LOGGED, loggers, "optim.lr=0.01"], paths["run"])
    assert resumed.resumed_from and resumed.resumed_from.endswith(store.step_dir_name(6))
    assert driver.run([*LOGGED, loggers, "optim.lr=0.01"], paths["run"]).global_step == 8
    return paths


def logged_values(run_dir: Path) -> dict[str, dict[int, float]]:
    """``metrics.csv`` by metric, then step."""
    values: dict[str, dict[int, float]] = {}
    with (run_dir / "metrics.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            for name, value in row.items():
                if name != "step" and value:
                    values.setdefault(name, {})[int(row["step"])] = float(value)
    return values


def test_tensorboard_has_each_step_once_after_a_kill_a_resume_and_a_rerun(relogged: dict[str, Path]) -> None:
    """Regression: TensorBoard purged from the step after the checkpoint, so a LearningRateMonitor's value of
    step 7 (Lightning's step 6) appeared twice; a rerun that trained nothing validated step 8 again (val/loss
    twice); every run logged Lightning's placeholder hp_metric."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(relogged["run"] / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    assert any(tag.startswith("lr-") for tag in tags), tags
    for tag in tags:
        steps = [e.step for e in events.Scalars(tag)]
        assert len(steps) == len(set(steps)), (tag, steps)
    assert "hp_metric" not in tags
    csv_values = logged_values(relogged["run"])
    for name in ("train/loss", "lr", "val/loss"):
        got = {e.step: e.value for e in events.Scalars(name)}
        assert got == pytest.approx(csv_values[name], rel=1e-4), name
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    tab = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert tab["optim.lr"].number_value == pytest.approx(1e-3), "TensorBoard shows a run's first HParams"
    written = yaml.safe_load((relogged["run"] / "tensorboard" / "hparams.yaml").read_text())
    assert written["optim.lr"] == written["resume.1.optim.lr"] == pytest.approx(0.01), (
        "hparams.yaml: the last"
    )
    assert written["resume.1.from_step"] == 6


def test_mlflow_holds_the_resumed_runs_values_of_the_redone_steps_and_notes_the_resume(
    relogged: dict[str, Path],
) -> None:
    """Regression: MLflow kept the killed attempt's values of the steps the resume redid (steps 7 and 8, with
    another optim.lr here), where metrics.csv and TensorBoard had the resumed run's; and its params kept the
    first run's values with no word of the change.

    MLflow cannot delete a value: the redone steps are logged again, and each step's newest value is the run's.
    """
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{relogged['mlflow']}")
    (run,) = client.search_runs([client.get_experiment_by_name("relogged").experiment_id])
    assert run.info.status == "FINISHED"
    for name, by_step in logged_values(relogged["run"]).items():
        newest: dict[int, tuple[int, float]] = {}
        for point in client.get_metric_history(run.info.run_id, name):
            if point.step not in newest or point.timestamp >= newest[point.step][0]:
                newest[point.step] = (point.timestamp, point.value)
        assert {step: value for step, (_, value) in newest.items()} == pytest.approx(by_step, rel=1e-4), name
    params = run.data.params
    assert float(params["optim.lr"]) == pytest.approx(1e-3), "a param keeps its first value"
    assert float(params["resume.1.optim.lr"]) == pytest.approx(0.01)
    assert (params["resume.1.from_step"], params["resume.1.relogged_steps"]) == ("6", "7-8")
    assert not any(key.startswith("resume.2.") for key in params), "the unchanged rerun had nothing to note"


def test_an_extension_keeps_the_validation_the_finished_run_ended_with_in_tensorboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a run's final checkpoint was saved before the validation it ends with (step 5 here, which
    ``trainer.val_every=4`` does not divide); an extension purged TensorBoard from that step and gave back
    only the checkpoint's metrics, so the finished run's last val/loss was gone.

    Regression: a rerun of the completed run (nothing to train) validated step 5 again, a second point of
    it in MLflow; the final checkpoint now records that validation, and the rerun validates nothing."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    short = ["recipe=blobs", "monitor.progress=off", "trainer.max_epochs=null", "trainer.val_every=4"]
    short += [
        "monitor.loggers=[csv,tensorboard]",
        "trainer.callbacks=[{_target_: tests.lightning_habits.ValidatedSteps}]",
    ]
    run_dir = tmp_path / "run"
    finished = driver.run([*short, "trainer.max_steps=5"], run_dir)
    assert finished.status == "completed"
    assert "val/loss" in store.read_manifest(str(run_dir / "checkpoints" / store.step_dir_name(5))).metrics
    rerun = driver.run([*short, "trainer.max_steps=5"], run_dir)
    assert (rerun.status, rerun.global_step, rerun.metrics) == ("completed", 5, finished.metrics)
    assert (run_dir / "validated.txt").read_text().split() == ["4", "5"], "the rerun validated nothing"
    assert driver.run([*short, "trainer.max_steps=6"], run_dir).global_step == 6
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("val/loss")] == [4, 5, 6]
    assert {e.step: e.value for e in events.Scalars("val/loss")} == pytest.approx(
        logged_values(run_dir)["val/loss"], rel=1e-5
    )
