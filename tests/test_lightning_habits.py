"""Lightning habits a team brings: callbacks by import path, Trainer knobs, loggers, their own modules."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from blocks.launch import driver
from blocks.launch.run_dir import FinishedRunKept
from tests.conftest import blocks_run_until_step, empty_mlflow_database, read_summary, run_in_process

pytestmark = pytest.mark.timeout(600)

BLOBS = ["recipe=blobs", "monitor.log_every_n_steps=1", "monitor.progress=off"]
EARLY_STOP = (
    "trainer.callbacks=[{_target_: pytorch_lightning.callbacks.EarlyStopping,"
    " monitor: val/loss, patience: 1, min_delta: 100.0}]"
)


def test_early_stopping_on_val_loss_stops_the_run_and_the_summary_says_so(tmp_path: Path) -> None:
    """A rerun that changes a training setting of the stopped run but gives it no more steps is
    refused, as for a run that trained all its steps.

    Regression: it "completed" at once with nothing trained (EarlyStopping's patience ignored too),
    and its config.yaml then recorded the changed settings over the weights of the old ones."""

    args = [*BLOBS, "trainer.max_steps=20", "trainer.val_every=2"]
    summary = driver.run([*args, EARLY_STOP], tmp_path)
    assert summary.status == "completed"
    # val/loss "improves" once (from +inf), then never by 100: patience 1 stops at the second validation.
    assert summary.global_step == 4
    assert summary.reason is not None and "stopped early by EarlyStopping at step 4 of 20" in summary.reason
    assert "val/loss" in summary.reason
    assert read_summary(tmp_path)["reason"] == summary.reason
    recorded = (tmp_path / "config.yaml").read_text()
    for changed, key in (
        (["optim.lr=0.5", EARLY_STOP], "optim.lr"),
        ([EARLY_STOP.replace("patience: 1", "patience: 5")], "trainer.callbacks"),
    ):
        with pytest.raises(FinishedRunKept) as refused:
            driver.run([*args, *changed], tmp_path)
        problem = refused.value.problems[0]
        assert problem.key == key and "stopped early at step 4 of its 20 steps" in problem.message, problem
        assert "trainer.max_steps above 20" in problem.fix, problem.fix
    assert (tmp_path / "config.yaml").read_text() == recorded
    assert read_summary(tmp_path)["reason"] == summary.reason, "the refused reruns left the run as it was"


def test_a_run_early_stopping_ended_is_finished_on_a_rerun_and_trains_on_when_extended(
    tmp_path: Path,
) -> None:
    """Rerun unchanged, a run an EarlyStopping stopped at an epoch boundary trains nothing and stays
    ``completed`` with its reason; given more epochs it trains on, the restored EarlyStopping deciding
    at the next validation.

    Regression: the rerun restored the last epoch with no batches left, Lightning ended it without a
    validation, and EarlyStopping failed the run on the missing ``val/loss`` (the summary turned
    ``failed``); an extension failed the same way.
    """
    args = [
        *BLOBS,
        "data.samples=70",
        "data.batch_size=8",
        "trainer.max_steps=null",
        EARLY_STOP,
    ]  # 7 steps an epoch
    first = driver.run([*args, "trainer.max_epochs=5"], tmp_path)
    assert (first.status, first.global_step) == ("completed", 14)
    rerun = driver.run([*args, "trainer.max_epochs=5"], tmp_path)
    assert (rerun.status, rerun.global_step, rerun.reason) == ("completed", 14, first.reason)
    assert rerun.state_digest == first.state_digest
    assert read_summary(tmp_path)["status"] == "completed"
    # regression: the fix named trainer.max_steps, which max_epochs=5 goes on bounding
    with pytest.raises(FinishedRunKept) as refused:
        driver.run([*args, "trainer.max_epochs=5", "optim.lr=0.5"], tmp_path)
    assert refused.value.problems[0].fix.endswith(
        "or raise trainer.max_epochs to 6 to train on from the checkpoint with it"
    ), refused.value.problems[0].fix
    extended = driver.run([*args, "trainer.max_epochs=6"], tmp_path)
    # val/loss never improves by 100: the restored patience is spent, one more epoch and it stops
    assert (extended.status, extended.global_step) == ("completed", 21)
    assert "stopped early by EarlyStopping at step 21 of 42" in (extended.reason or "")


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


def test_lightning_logging_callbacks_log_at_the_monitor_cadence(tmp_path: Path, monkeypatch) -> None:
    """LearningRateMonitor and a callback's ``self.log`` follow ``monitor.log_every_n_steps``, not Lightning's 50.

    The LR Lightning's monitor reads before step N+1 (its step N) is the ``lr`` blocks logs for step N+1.
    """
    import csv

    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    every, steps = 3, 12
    callbacks = (
        "trainer.callbacks=[{_target_: pytorch_lightning.callbacks.LearningRateMonitor},"
        " {_target_: tests.lightning_habits.LogStep}]"
    )
    logger = f"monitor.loggers=[csv,{{_target_: pytorch_lightning.loggers.CSVLogger, save_dir: '{tmp_path}', name: lit}}]"
    args = [
        "recipe=blobs",
        "monitor.progress=off",
        f"monitor.log_every_n_steps={every}",
        "trainer.max_epochs=null",
        f"trainer.max_steps={steps}",
        "trainer.val_every=null",
        "optim.warmup_steps=6",
        callbacks,
        logger,
    ]
    assert driver.run(args, tmp_path / "run").status == "completed"
    (version,) = (tmp_path / "lit").iterdir()
    with (version / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    lr_columns = [name for name in rows[0] if name.startswith("lr-")]
    assert lr_columns, f"LearningRateMonitor logged nothing in {steps} steps"
    monitored = {int(r["step"]): float(r[lr_columns[0]]) for r in rows if r.get(lr_columns[0])}
    logged_by_callback = [int(r["step"]) for r in rows if r.get("habit/step")]
    assert len(monitored) == steps // every, monitored
    assert {b - a for a, b in itertools.pairwise(sorted(monitored))} == {every}, monitored
    assert len(logged_by_callback) == steps // every, logged_by_callback
    assert {b - a for a, b in itertools.pairwise(logged_by_callback)} == {every}, logged_by_callback
    with (tmp_path / "run" / "metrics.csv").open(newline="") as fh:
        blocks_lr = {int(r["step"]): float(r["lr"]) for r in csv.DictReader(fh) if r.get("lr")}
    for step, lr in monitored.items():
        assert blocks_lr[step + 1] == pytest.approx(lr, rel=1e-5), (step, blocks_lr)


@pytest.mark.parametrize(
    ("override", "said"),
    [
        (
            "trainer.callbacks=[{_target_: os.system, command: touch pwned}]",
            "trainer.callbacks[0]._target_: 'os.system' is refused",
        ),
        ("monitor.loggers=[csv,{_target_: os.system, command: touch pwned}]", "'os.system' is refused"),
        ("monitor.loggers=[os.system]", "'os.system' is refused"),
        (
            "trainer.callbacks=[{_target_: tests.lightning_habits.not_a_callback}]",
            "not a Lightning Callback class",
        ),
        (
            "trainer.callbacks=[{_target_: tests.lightning_habits.StepLog, path: {_target_: os.system}}]",
            "trainer.callbacks[0].path._target_: 'os.system' is refused",
        ),
        ("trainer.callbacks=[{_target_: tests.legacy_team.Shell}]", "is really subprocess.Popen"),
        (
            "trainer.callbacks=[{_target_: pytorch_lightning.callbacks.LearningRateMonitor}]",
            "logs through a Lightning logger, and monitor.loggers has none",
        ),
    ],
)
def test_code_that_is_no_callback_or_logger_is_refused_before_anything_starts(
    override: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    run_dir = tmp_path / "run"
    result = run_in_process(
        ["run", *BLOBS, "trainer.max_steps=2", override, f"hydra.run.dir={run_dir}"], cwd=tmp_path
    )
    assert result.returncode == 2, result.output
    assert not run_dir.exists() and not (tmp_path / "pwned").exists()
    assert said in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output


def test_a_callback_lightning_refuses_at_set_up_is_an_error_on_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A callback the plan cannot judge (a team's LearningRateMonitor, no logger) fails on its key, no traceback.

    Only Lightning's own classes are judged by name, and only a refusal while Lightning sets up
    is "could not start" (exit 2); the same exception once training ran is a training failure.
    """
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    callback = "trainer.callbacks=[{_target_: tests.lightning_habits.TeamLearningRateMonitor}]"
    run_dir = tmp_path / "run"
    result = run_in_process(
        ["run", *BLOBS, "trainer.max_steps=2", callback, f"hydra.run.dir={run_dir}"], cwd=tmp_path
    )
    assert result.returncode == 2, result.output
    text = " ".join(result.output.split())
    assert "trainer.callbacks[0]: TeamLearningRateMonitor refused the run" in text, text[-2000:]
    assert "monitor.loggers=[csv,tensorboard]" in text
    assert "Traceback" not in result.output
    assert read_summary(run_dir)["status"] == "failed"

    namesake = "trainer.callbacks=[{_target_: tests.lightning_habits.LearningRateMonitor}]"
    planned = run_in_process(["plan", *BLOBS, namesake], cwd=tmp_path)
    assert planned.returncode == 0, "only Lightning's LearningRateMonitor needs a logger, not a namesake"

    mid_run = "trainer.callbacks=[{_target_: tests.lightning_habits.RefusesMidRun}]"
    late = tmp_path / "late"
    result = run_in_process(
        ["run", *BLOBS, "trainer.max_steps=4", mid_run, f"hydra.run.dir={late}"], cwd=tmp_path
    )
    assert result.returncode == 1, (
        "a callback's error after training started is a training failure, not exit 2"
    )
    summary = read_summary(late)
    assert summary["status"] == "failed" and summary["global_step"] == 2
    assert "changed its mind" in summary["reason"]


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


def test_overfit_batches_are_the_epoch_the_summary_counts_and_what_eval_scores(tmp_path: Path) -> None:
    overfit = ["trainer.overfit_batches=2", "data.batch_size=512", "trainer.max_epochs=3"]
    summary = driver.run([*BLOBS, *overfit, "trainer.max_steps=5"], tmp_path)
    assert summary.status == "completed" and summary.global_step == 5
    assert summary.epoch == 2, "two passes of two optimizer steps over the overfit batches, then one step"

    from blocks.launch.evaluate import evaluation

    scored = evaluation(str(tmp_path))  # the overfit batches the run validated on, not its val split
    assert scored.metrics["val/loss"] == pytest.approx(summary.metrics["val/loss"], rel=1e-5)
    assert scored.metrics["val/accuracy"] == pytest.approx(summary.metrics["val/accuracy"], rel=1e-5)
    (note,) = scored.notes
    assert "trainer.overfit_batches=2, 1024 samples" in note and "not on its val split" in note
    real = evaluation(str(tmp_path), ["trainer.overfit_batches=0"])
    assert real.metrics["val/loss"] != pytest.approx(summary.metrics["val/loss"], rel=1e-5) and not real.notes


def test_a_lightning_module_whose_own_steps_would_be_ignored_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    run_dir = tmp_path / "run"
    result = run_in_process(
        [
            "run",
            *BLOBS,
            "model=torch_module",
            "model.target=tests.legacy_team.LitNet",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.output
    assert not run_dir.exists()
    text = " ".join(result.output.split())
    assert "defines training_step, configure_optimizers" in text
    assert "uses only its forward" in text and "name the nn.Module it wraps" in text


@pytest.mark.parametrize(
    ("target", "kwargs", "batch_size", "said"),
    [
        ("CollatingDM", {}, 32, "has its own collate_fn"),
        ("WeightedDM", {}, 32, "uses the sampler WeightedRandomSampler"),
        ("ClustersDM", {"batch_size": 16}, 32, "batches 16 samples"),
    ],
)
def test_datamodule_loader_options_blocks_would_drop_are_refused(
    target: str, kwargs: dict, batch_size: int, said: str, monkeypatch
) -> None:
    from blocks.data.adapter import LightningData
    from blocks.spec.errors import ConfigError

    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    data = LightningData(
        target=f"tests.legacy_team.{target}",
        kwargs=kwargs,
        num_features=8,
        num_classes=3,
        train_samples=192,
        val_samples=64,
        batch_size=batch_size,
    )
    with pytest.raises(ConfigError) as refused:
        data.build("train")
    assert said in str(refused.value)
    assert len(data.replace(target="tests.legacy_team.ClustersDM", kwargs={}).build("train")) == 192


def test_a_datamodule_whose_batch_transfer_hooks_would_be_skipped_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: its hooks were never called (blocks' own datamodule moved the batches) and the run completed."""
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    run_dir = tmp_path / "run"
    datamodule = [
        "data=lightning_data",
        "data.num_features=8",
        "data.num_classes=3",
        "data.train_samples=192",
        "data.val_samples=64",
    ]
    args = [
        "run",
        *BLOBS,
        *datamodule,
        "trainer.max_steps=20",
        "trainer.max_epochs=null",
        "checkpoint.enabled=false",
    ]
    result = run_in_process(
        [*args, "data.target=tests.legacy_team.HookDM", f"hydra.run.dir={run_dir}"], cwd=tmp_path
    )
    assert result.returncode == 2, result.output
    assert not run_dir.exists()
    text = " ".join(result.output.split())
    assert "error data.target: 'tests.legacy_team.HookDM' is a LightningDataModule that defines" in text
    assert "on_before_batch_transfer, transfer_batch_to_device, on_after_batch_transfer" in text
    assert "would never be called" in text
    assert "into the dataset's items" in text and "into the model's forward" in text, text


@pytest.mark.parametrize(
    ("target", "hooks", "fix"),
    [
        (
            "HookDM",
            "on_before_batch_transfer, transfer_batch_to_device, on_after_batch_transfer",
            "model's forward",
        ),
        (
            "StatefulDM",
            "state_dict, load_state_dict",
            "blocks' checkpoints do not hold the datamodule's state",
        ),
        ("TidyDM", "teardown, on_exception", "blocks keeps only the datasets, not the datamodule"),
        ("PredictingDM", "predict_dataloader", "blocks has no predict loop"),
    ],
)
def test_datamodule_hooks_blocks_would_never_call_are_refused(
    target: str, hooks: str, fix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: Lightning calls these on the trainer's datamodule, which is blocks' own; they were dropped."""
    from blocks.data.adapter import LightningData
    from blocks.spec.errors import ConfigError

    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    data = LightningData(
        target=f"tests.legacy_team.{target}", num_features=8, num_classes=3, train_samples=192, val_samples=64
    )
    with pytest.raises(ConfigError) as refused:
        data.build("train")
    (problem,) = refused.value.problems
    assert problem.key == "data.target" and f"defines {hooks};" in problem.message, problem
    assert fix in problem.fix and f"{hooks.split(',')[0]} = LightningDataModule." in problem.fix, problem
    restored = data.replace(target="tests.legacy_team.RestoredHookDM")
    assert len(restored.build("train")) == 192, (
        "Lightning's own hooks, put back by a subclass, are not refused"
    )


@pytest.mark.slow
def test_a_datamodules_prepare_data_runs_once_per_node_before_any_process_sets_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: every process called it, once per split (four calls in a two-process job), racing to
    write the same files; Lightning calls it on the first process of each node while the others wait."""
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    run_dir = tmp_path / "run"
    args = [
        "run",
        *BLOBS,
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.max_steps=2",
        "checkpoint.enabled=false",
        "data=lightning_data",
        "data.target=tests.legacy_team.DownloadingDM",
        f"data.kwargs={{root:{tmp_path}}}",
        "data.num_features=8",
        "data.num_classes=3",
        "data.train_samples=192",
        "data.val_samples=64",
        f"hydra.run.dir={run_dir}",
    ]
    result = run_in_process(args, cwd=tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    assert read_summary(run_dir)["world_size"] == 2
    assert len((tmp_path / "prepared").read_text().split()) == 1


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One run with TensorBoard, MLflow (sqlite) and a CSVLogger: killed (-9) at step 8, resumed to step 12."""
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("loggers")
    paths = {"run": root / "run", "mlflow": root / "mlflow.db", "csv": root / "csvlogs"}
    empty_mlflow_database(paths["mlflow"])
    loggers = (
        "monitor.loggers=[csv,tensorboard,"
        f"{{_target_: pytorch_lightning.loggers.MLFlowLogger, tracking_uri: 'sqlite:///{paths['mlflow']}',"
        " experiment_name: habits},"
        f"{{_target_: pytorch_lightning.loggers.CSVLogger, save_dir: '{paths['csv']}', name: exp}}]"
    )
    args = [
        "recipe=blobs",
        "monitor.log_every_n_steps=1",
        "trainer.max_epochs=null",
        "trainer.max_steps=12",
        "trainer.val_every=4",
        "checkpoint.every_n_steps=3",
        "checkpoint.async_save=false",
        loggers,
    ]
    with blocks_run_until_step([*args, f"hydra.run.dir={paths['run']}"], cwd=root, step=8) as proc:
        assert proc.poll() is None, "still training when killed"
    assert not (paths["run"] / "summary.json").exists(), "killed -9: no summary"
    summary = driver.run([*args, "monitor.progress=off"], paths["run"])
    assert summary.status == "completed" and summary.resumed_from, summary
    assert int(summary.resumed_from.rsplit("-", 1)[1]) in (6, 9) and summary.global_step == 12
    return paths


STEPS = list(range(1, 13))


@pytest.mark.slow
def test_tensorboard_has_each_step_once_and_the_config_as_hparams(
    killed_and_resumed: dict[str, Path],
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(killed_and_resumed["run"] / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == STEPS
    assert [e.step for e in events.Scalars("val/loss")] == [4, 8, 12]
    hparams = set()
    for content in events.PluginTagToContent("hparams").values():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        hparams |= set(data.session_start_info.hparams)
    assert {"optim.lr", "trainer.max_steps", "derived.total_steps", "derived.global_batch"} <= hparams


@pytest.mark.slow
def test_mlflow_continues_one_run_with_every_step_and_the_config_as_params(
    killed_and_resumed: dict[str, Path],
) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{killed_and_resumed['mlflow']}")
    experiment = client.get_experiment_by_name("habits")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, "the resumed run continued the killed one's MLflow run"
    run = runs[0]
    steps = sorted({m.step for m in client.get_metric_history(run.info.run_id, "train/loss")})
    assert steps == STEPS, "every step (the redone ones logged again: see test_faults_resume_metrics)"
    assert sorted({m.step for m in client.get_metric_history(run.info.run_id, "val/loss")}) == [4, 8, 12]
    config = OmegaConf.load(killed_and_resumed["run"] / "config.yaml")
    assert float(run.data.params["optim.lr"]) == pytest.approx(config.optim.lr)
    assert int(run.data.params["derived.total_steps"]) == 12
    assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_a_csv_logger_keeps_its_rows_and_has_each_step_once(killed_and_resumed: dict[str, Path]) -> None:
    import csv

    import yaml

    (version,) = (killed_and_resumed["csv"] / "exp").iterdir()
    with (version / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(int(r["step"]) for r in rows if r.get("train/loss")) == STEPS
    assert sorted(int(r["step"]) for r in rows if r.get("val/loss")) == [4, 8, 12]
    params = yaml.safe_load((version / "hparams.yaml").read_text())
    assert params["derived.total_steps"] == 12 and "optim.lr" in params
    with (killed_and_resumed["run"] / "metrics.csv").open(newline="") as fh:
        assert [int(r["step"]) for r in csv.DictReader(fh)] == STEPS, "the run dir's metrics.csv too"


@pytest.mark.parametrize(
    ("logger", "said", "fix"),
    [
        (
            "{_target_: pytorch_lightning.loggers.MLFlowLogger, tracking_uri: 'file:./mlruns'}",
            "could not start",
            "sqlite:///mlflow.db",
        ),
        (
            "{_target_: pytorch_lightning.loggers.CSVLogger, no_such_argument: 1}",
            "could not be built",
            "CSVLogger",
        ),
    ],
)
def test_a_logger_that_cannot_start_fails_before_the_first_step(
    logger: str, said: str, fix: str, tmp_path: Path
) -> None:
    pytest.importorskip("mlflow")
    run_dir = tmp_path / "run"
    result = run_in_process(
        ["run", *BLOBS, "trainer.max_steps=3", f"monitor.loggers=[csv,{logger}]", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
    )
    assert result.returncode != 0
    text = " ".join(result.output.split())
    assert said in text and fix in text, text[-2000:]
    assert "Traceback" not in result.output
    assert not (run_dir / "metrics.csv").exists(), "no training step ran"


def test_a_ctrl_c_while_a_one_process_run_is_built_is_an_interruption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a SIGINT before training started (its signal handling not armed yet) left
    ``failed`` with exit 1, where the contract says ``interrupted`` and 130."""
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    callback = "trainer.callbacks=[{_target_: tests.lightning_habits.CtrlCWhileBuilt}]"
    run_dir = tmp_path / "run"
    result = run_in_process(
        ["run", *BLOBS, "trainer.max_steps=2", callback, f"hydra.run.dir={run_dir}"], cwd=tmp_path
    )
    assert result.returncode == 130 and "Traceback" not in result.output, result.output
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted" and summary["global_step"] == 0, summary
    assert "SIGINT" in summary["reason"] and "run the same command" in summary["reason"], summary
