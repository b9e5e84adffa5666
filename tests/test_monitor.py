"""Watching a run: metrics, loggers (TensorBoard, Lightning), health policies, the stall watchdog, console output."""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from blocks.checkpoint import store
from blocks.launch import driver
from tests.conftest import mlflow_logger, mlflow_statuses, read_summary, run_in_process

pytestmark = pytest.mark.timeout(600)

BLOBS = ["recipe=blobs", "monitor.log_every_n_steps=1", "monitor.progress=off"]
HUGE_LR = [
    *BLOBS,
    "optim.lr=1e8",
    "optim.warmup_steps=0",
    "trainer.max_steps=8",
    "checkpoint.every_n_steps=2",
]


def metrics(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_every_logged_row_has_throughput_timing_and_memory(tmp_path: Path) -> None:
    # tiny_lm: a transformer on text, as the default recipe, at a fraction of its step time
    summary = driver.run(
        ["recipe=tiny_lm", "debug=fast", "trainer.max_steps=3", "monitor.progress=off"], tmp_path
    )
    assert summary.status == "completed"
    rows = metrics(tmp_path)
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    for row in rows:
        for column in ("train/loss", "lr", "grad_norm", "samples_per_s", "tokens_per_s", "step_time_s"):
            assert float(row[column]) > 0, column
        assert float(row["data_wait_s"]) >= 0
        assert float(row["peak_memory_mb"]) > 10, "process RSS on CPU"
        assert float(row["tflops_per_s"]) > 0, "the transformer reports its FLOPs per sample"
        assert "mfu" not in row, "no MFU on a CPU, whose peak is unknown"
    seq_len = OmegaConf.load(tmp_path / "config.yaml").data.seq_len
    assert float(rows[0]["tokens_per_s"]) / float(rows[0]["samples_per_s"]) == pytest.approx(
        seq_len, rel=1e-4
    )


def test_a_jobs_peak_memory_is_its_own_not_an_earlier_jobs_in_the_process(tmp_path: Path) -> None:
    """Regression: ``peak_memory_mb`` was the process's high-water mark (``ru_maxrss`` on a CPU, CUDA's
    never-reset peak), so a sweep's small job run after a big one in the same process (the basic
    launcher runs them in the ``blocks run`` process) reported the big one's peak."""
    sweep = tmp_path / "sweep"
    result = run_in_process(
        [
            "run",
            "-m",
            *BLOBS,
            "trainer.max_steps=2",
            "data.batch_size=256",
            "checkpoint.enabled=false",
            "model.hidden=[4096,4096],[8]",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.output[-3000:]
    big_mb, small_mb = (read_summary(sweep / job)["metrics"]["peak_memory_mb"] for job in ("0", "1"))
    # The big model's 4096x4096 layer alone is 256 MiB with its gradients and Adam's two moments.
    assert small_mb < big_mb - 128, (big_mb, small_mb)


def test_tensorboard_events_are_read_back_by_tensorboard(tmp_path: Path) -> None:
    summary = driver.run([*BLOBS, "trainer.max_steps=6", "monitor.loggers=[csv,tensorboard]"], tmp_path)
    assert summary.status == "completed"
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    for tag in ("train/loss", "lr", "grad_norm", "samples_per_s", "val/loss"):
        assert tag in tags
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == [1, 2, 3, 4, 5, 6]
    csv_losses = [float(r["train/loss"]) for r in metrics(tmp_path)]
    assert [e.value for e in losses] == pytest.approx(csv_losses, rel=1e-5)
    assert (tmp_path / "metrics.csv").exists(), "metrics.csv is written whatever the loggers"


def test_a_fresh_start_in_a_run_dir_shows_only_its_own_steps_in_tensorboard(tmp_path: Path) -> None:
    """``checkpoint.resume=never`` in a run dir an earlier run logged to started ``metrics.csv``
    over but left the earlier run's TensorBoard events in force: TensorBoard showed both runs'
    steps one after the other, the earlier run's losses where metrics.csv had the new run's."""
    args = [*BLOBS, "monitor.loggers=[csv,tensorboard]"]
    assert driver.run([*args, "trainer.max_steps=6"], tmp_path).status == "completed"
    again = [*args, "trainer.max_steps=3", "optim.lr=1e-4", "checkpoint.resume=never"]
    assert driver.run(again, tmp_path).status == "completed"
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == [1, 2, 3]
    csv_losses = [float(r["train/loss"]) for r in metrics(tmp_path) if r["train/loss"]]
    assert [e.value for e in losses] == pytest.approx(csv_losses, rel=1e-5)


def test_a_resumed_run_continues_the_same_lightning_logger_run(tmp_path: Path) -> None:
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    args = [
        *BLOBS,
        "monitor.loggers=[pytorch_lightning.loggers.CSVLogger]",
        f"+monitor.logger_args.save_dir={logs}",
        "+monitor.logger_args.name=exp",
    ]
    assert driver.run([*args, "trainer.max_steps=4"], run_dir).status == "completed"
    assert [p.name for p in (logs / "exp").iterdir()] == ["version_0"]
    assert driver.run([*args, "trainer.max_steps=8"], run_dir).resumed_from
    assert [p.name for p in (logs / "exp").iterdir()] == ["version_0"], (
        "the resumed run logs into the same run"
    )
    with (logs / "exp" / "version_0" / "metrics.csv").open(newline="") as fh:
        steps = {int(r["step"]) for r in csv.DictReader(fh)}
    assert {5, 8} <= steps, "the resumed steps went to the same logger run"


def test_a_huge_lr_under_stop_fails_the_run_with_the_reason(cli_in_process, tmp_path: Path) -> None:
    """The run fails with its reason, and its MLflow run is FAILED (blocks finalized it FINISHED after Lightning's FAILED)."""
    result = cli_in_process(
        "run",
        *HUGE_LR,
        "monitor.on_nonfinite=stop",
        mlflow_logger(tmp_path / "mlflow.db", "huge"),
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 1
    assert mlflow_statuses(tmp_path / "mlflow.db", "huge") == ["FAILED"]
    assert "Traceback" not in result.output
    summary = read_summary(tmp_path / "run")
    assert summary["status"] == "failed"
    assert "monitor.on_nonfinite=stop" in summary["reason"]
    assert re.search(r"(train/loss|grad_norm) is (nan|inf)", summary["reason"])
    assert summary["global_step"] < 8
    # Regression: the whole-run throughput of a run that failed was 0.0 (its clock stopped only at a normal end).
    assert summary["samples_per_s"] > 0 and summary["train_s"] > 0
    global_batch = json.loads((tmp_path / "run" / "plan.json").read_text())["derived"]["global_batch"]
    trained = summary["samples_per_s"] * summary["train_s"]
    assert trained == pytest.approx(summary["global_step"] * global_batch, rel=1e-6)


@pytest.mark.slow
def test_under_ddp_every_rank_stops_together(cli_in_process, tmp_path: Path) -> None:
    result = cli_in_process(
        "run", *HUGE_LR, "strategy=ddp", "trainer.devices=2", f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert result.returncode == 1
    summary = read_summary(tmp_path / "run")
    assert summary["status"] == "failed" and "monitor.on_nonfinite=stop" in summary["reason"]
    assert summary["world_size"] == 2


def test_a_huge_lr_under_skip_skips_the_bad_steps(tmp_path: Path) -> None:
    summary = driver.run([*HUGE_LR, "monitor.on_nonfinite=skip"], tmp_path)
    assert summary.status == "completed" and summary.global_step == 8
    skipped = summary.metrics["health/skipped_steps"]
    assert 1 <= skipped < 8
    assert "health/rollbacks" not in summary.metrics
    rows = metrics(tmp_path)
    assert all(math.isfinite(float(r["train/loss"])) for r in rows if r["train/loss"]), (
        "skipped steps do not count in the logged loss"
    )


def test_a_huge_lr_under_rollback_rolls_back_to_the_last_checkpoint(tmp_path: Path) -> None:
    summary = driver.run([*HUGE_LR, "monitor.on_nonfinite=rollback"], tmp_path)
    assert summary.status == "completed" and summary.global_step == 8
    assert summary.metrics["health/rollbacks"] >= 1
    assert summary.metrics["health/skipped_steps"] >= summary.metrics["health/rollbacks"]


def test_bad_steps_in_a_row_past_the_limit_fail_the_run(tmp_path: Path) -> None:
    with pytest.raises(driver.JobFailed) as failure:
        driver.run([*HUGE_LR, "monitor.on_nonfinite=skip", "monitor.max_bad_steps=2"], tmp_path)
    assert failure.value.summary.status == "failed"
    assert "monitor.max_bad_steps=2" in (failure.value.summary.reason or "")


def test_rollback_without_checkpoints_is_a_plan_error(cli) -> None:
    result = cli("plan", "recipe=blobs", "monitor.on_nonfinite=rollback", "checkpoint.enabled=false")
    assert result.returncode == 2
    assert "monitor.on_nonfinite" in result.output and "checkpoint.enabled" in result.output


@pytest.mark.slow
def test_a_stalled_rank_dumps_every_ranks_stacks_and_fails_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    monkeypatch.setenv("BLOCKS_FAULT_STALL", "1:3:300")  # read by the workers
    result = run_in_process(
        [
            "run",
            *BLOBS,
            "trainer.max_steps=200",
            "strategy=ddp",
            "trainer.devices=2",
            "monitor.stall_timeout_s=3",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.output[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "failed"
    assert "stalled" in summary["reason"] and "monitor.stall_timeout_s" in summary["reason"]
    # Regression: the process ended with the last row still buffered, and the summary had no metrics.
    with (run_dir / "metrics.csv").open() as fh:
        steps = [int(row["step"]) for row in csv.DictReader(fh)]
    assert steps == list(range(1, summary["global_step"] + 1)), steps
    assert "train/loss" in summary["metrics"] and summary["epoch"] == 0
    stacks = {p.name: p.read_text() for p in (run_dir / "stacks").glob("rank*")}
    assert set(stacks) == {"rank0-attempt0.txt", "rank1-attempt0.txt"}
    assert "on_train_batch_end" in stacks["rank1-attempt0.txt"], (
        "the stalled rank's stack shows where it sleeps"
    )
    assert "fit" in stacks["rank0-attempt0.txt"], "the waiting rank's stack shows the training loop"


def test_a_stalled_job_of_a_one_process_sweep_fails_and_the_sweep_goes_on(
    cli_in_process, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the watchdog ended the sweep's own process, so later jobs never ran and nothing said
    which job did not complete; the stalled job lost its last buffered metrics row and its summary had no metrics."""
    sweep = tmp_path / "sweep"
    monkeypatch.setenv("BLOCKS_FAULT_STALL", "0:3:300")  # only the job with a watchdog (job 0) stalls
    result = cli_in_process(
        "run",
        "-m",
        *BLOBS,
        "trainer.max_steps=5",
        "checkpoint.every_n_steps=2",
        "monitor.stall_timeout_s=2,0",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 1, result.output[-3000:]
    assert f"1 job(s) of the sweep did not complete: {sweep / '0'} " in result.output
    assert read_summary(sweep / "1")["status"] == "completed", "the sweep went on past the stalled job"
    stalled = read_summary(sweep / "0")
    assert stalled["status"] == "failed" and stalled["global_step"] == 3
    assert stalled["reason"].startswith(
        "stalled: no training step for 2s after step 3 (monitor.stall_timeout_s)"
    )
    assert "train/loss" in stalled["metrics"] and "grad_norm" in stalled["metrics"]
    with (sweep / "0" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [row["step"] for row in rows] == ["1", "2", "3"], "the row buffered when it stalled is written"
    assert float(rows[-1]["train/loss"]) == pytest.approx(stalled["metrics"]["train/loss"], rel=1e-5)
    assert (sweep / "0" / "checkpoints" / store.step_dir_name(2)).is_dir(), "its last checkpoint is kept"
    assert (sweep / "0" / "stacks" / "rank0-attempt0.txt").exists()


def test_a_stalled_one_process_run_exits_3_and_leaves_the_process_to_its_caller(
    cli_in_process, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contract's exit status 3, now that the watchdog fails the run in its own thread (it ended the process)."""
    monkeypatch.setenv("BLOCKS_FAULT_STALL", "0:1:300")
    run_dir = tmp_path / "run"
    result = cli_in_process(
        "run", *BLOBS, "trainer.max_steps=3", "monitor.stall_timeout_s=1", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 3, result.output[-3000:]
    assert read_summary(run_dir)["reason"].startswith("stalled: no training step for 1s after step 1")


def test_a_stall_that_never_returns_to_python_is_recorded_and_ends_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that shares its process is interrupted first; stuck where no signal reaches Python, the watchdog
    records the stall itself and ends the process, and the run's own summary is not written over it."""
    import signal
    import threading

    import pytorch_lightning as pl

    from blocks.runtime import health

    exits: list[int] = []
    recorded = threading.Event()
    monkeypatch.setattr(health.os, "_exit", exits.append)
    watchdog = health.StallWatchdog(
        1, tmp_path, on_stall=lambda reason, step: recorded.set(), grace_s=0.5, exits_process=False
    )
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    handler = signal.getsignal(health.STALL_SIGNAL)
    watchdog.on_train_start(trainer, None)  # type: ignore[arg-type]
    signal.pthread_sigmask(signal.SIG_BLOCK, [health.STALL_SIGNAL])  # as C code that never checks signals
    try:
        assert recorded.wait(30), "the watchdog recorded the stall"
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [health.STALL_SIGNAL])  # the pending signal: no raise now
        watchdog.on_train_end(trainer, None)  # type: ignore[arg-type]
    watchdog._thread.join(10)  # type: ignore[union-attr]
    assert exits == [health.STALL_EXIT_CODE]
    assert watchdog.fired, "the watchdog recorded the stall: the run's own thread writes no summary"
    assert signal.getsignal(health.STALL_SIGNAL) == handler, "the signal's handler is given back"


def test_a_stalled_run_whose_teardown_waits_on_a_save_that_never_returns_still_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: once the watchdog interrupted the main thread it stood down, and Lightning's teardown then
    waited on the background checkpoint save for as long as it hung: `blocks run` and a sweep hung forever."""
    from blocks.runtime import health

    exits: list[int] = []
    monkeypatch.setattr(health.os, "_exit", exits.append)
    monkeypatch.setattr(health, "STALL_GRACE_S", 1.0)
    monkeypatch.setenv("BLOCKS_FAULT_SLOW_SAVE", "2:6")  # the save of step 3 waits on it: no step for 1s
    run_dir = tmp_path / "run"
    with pytest.raises(driver.JobFailed):
        driver.run(
            [
                *BLOBS,
                "trainer.max_steps=4",
                "checkpoint.every_n_steps=1",
                "checkpoint.async_save=true",
                "monitor.stall_timeout_s=1",
            ],
            run_dir,
        )
    assert exits == [health.STALL_EXIT_CODE], "the job did not end within the grace: the process ends"
    assert "the job did not end within 1s after it" in capsys.readouterr().out
    summary = read_summary(run_dir)
    assert summary["status"] == "failed"
    assert summary["reason"].startswith("stalled: no training step for 1s after step 3")


def test_a_stall_of_training_outside_the_main_thread_says_it_cannot_be_interrupted(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: the Python API called from another thread cannot be interrupted, yet the watchdog said training
    did not stop within the grace (nothing waited) and nothing warned that a stall would end the process."""
    import threading

    import pytorch_lightning as pl

    from blocks.runtime import health

    exits: list[int] = []
    recorded = threading.Event()
    monkeypatch.setattr(health.os, "_exit", exits.append)
    watchdog = health.StallWatchdog(
        1, tmp_path, on_stall=lambda reason, step: recorded.set(), grace_s=30, exits_process=False
    )
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with caplog.at_level(logging.WARNING):
        training = threading.Thread(target=watchdog.on_train_start, args=(trainer, None))
        training.start()
        training.join()
        assert recorded.wait(30), "the watchdog recorded the stall"
    watchdog.on_train_end(trainer, None)  # type: ignore[arg-type]
    watchdog._thread.join(10)  # type: ignore[union-attr]
    assert exits == [health.STALL_EXIT_CODE]
    assert watchdog.fired
    out = capsys.readouterr().out
    assert "training runs outside the main thread, where the stall watchdog cannot interrupt it" in out
    assert "did not stop within" not in out
    assert "training runs outside the main thread" in caplog.text, "the run warned when it started"


@pytest.mark.slow
def test_after_a_stall_torchrun_restarts_the_job_and_it_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    monkeypatch.setenv("BLOCKS_FAULT_STALL", "0:5:300")  # read by the workers
    result = run_in_process(
        [
            "run",
            *BLOBS,
            "trainer.max_steps=12",
            "strategy=ddp",
            "trainer.devices=2",
            "trainer.max_failures=1",
            "checkpoint.every_n_steps=2",
            "monitor.stall_timeout_s=3",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.output[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["restarts"] == 1
    assert summary["resumed_from"].endswith(store.step_dir_name(4)), (
        "the restart resumed from the last checkpoint"
    )
    assert sorted(p.name for p in (run_dir / "stacks").glob("rank*")) == [
        "rank0-attempt0.txt",
        "rank1-attempt0.txt",
    ]


def test_the_gradient_norm_of_low_precision_gradients_is_not_rounded_to_their_dtype() -> None:
    """bf16 gradients' norm as the float64 norm of the same values (was rounded to bf16's 3 digits), fp16's not inf."""
    import torch

    from blocks.runtime.health import total_grad_norm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)).to(torch.bfloat16)
    model(torch.randn(16, 64, dtype=torch.bfloat16)).float().pow(2).sum().backward()
    exact = torch.cat([p.grad.double().flatten() for p in model.parameters()]).norm().item()
    norm = total_grad_norm(model)
    assert norm is not None and norm.dtype == torch.float32
    assert norm.item() == pytest.approx(exact, rel=1e-6)

    half = torch.nn.Linear(4, 1, bias=False).to(torch.float16)
    half.weight.grad = torch.full_like(
        half.weight, 60000.0
    )  # each finite; their norm (120000) is past fp16's max
    assert total_grad_norm(half).item() == pytest.approx(120000.0)


def test_a_gradient_norm_spike_over_the_running_median_is_a_warning(caplog) -> None:
    import pytorch_lightning as pl

    from blocks.runtime.health import HealthGuard

    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    guard = HealthGuard("stop", max_bad_steps=20, spike_factor=10.0, checkpoint_dir=None)
    for norm in (1.0, 1.2, 0.9, 1.1, 1.0, 9.0):
        guard.check_row(trainer, {"train/loss": 1.0, "grad_norm": norm})
    assert guard.grad_spikes == 0, "9× the median is under the factor"
    with caplog.at_level("WARNING", logger="blocks.runtime.health"):
        guard.check_row(trainer, {"train/loss": 1.0, "grad_norm": 30.0})
    assert guard.grad_spikes == 1 and guard.row()["health/grad_spikes"] == 1
    assert "running median" in caplog.text and "monitor.grad_spike_factor" in caplog.text


def test_stop_leaves_overflowing_gradients_to_the_fp16_scaler() -> None:
    import pytorch_lightning as pl

    from blocks.runtime.health import HealthGuard, NonFiniteError

    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    scaled = HealthGuard("stop", max_bad_steps=20, spike_factor=0, checkpoint_dir=None, grad_scaler=True)
    scaled.check_row(trainer, {"train/loss": 1.0, "grad_norm": math.inf})
    with pytest.raises(NonFiniteError, match="train/loss is nan"):
        scaled.check_row(trainer, {"train/loss": math.nan})
    plain = HealthGuard("stop", max_bad_steps=20, spike_factor=0, checkpoint_dir=None)
    with pytest.raises(NonFiniteError, match="grad_norm is inf"):
        plain.check_row(trainer, {"train/loss": 1.0, "grad_norm": math.inf})


def test_grad_norm_under_a_gradient_scaler_is_the_applied_norm_with_a_fused_optimizer(tmp_path: Path) -> None:
    """Regression: Lightning leaves the gradients of an optimizer that unscales inside its step (fused
    AdamW, what ``optim.fused=null`` picks without clipping) multiplied by the loss scale, and
    ``grad_norm`` logged them: 65536× the norm the unfused optimizer's run logged."""
    import torch
    from pytorch_lightning.plugins.precision import MixedPrecision

    from blocks.runtime.trainer import build_run

    logged = {}
    for fused in ("true", "false"):
        run_dir = tmp_path / f"fused-{fused}"
        overrides = [
            *BLOBS,
            "optim=adamw",
            f"optim.fused={fused}",
            "optim.grad_clip=null",
            "trainer.max_steps=3",
        ]
        built = build_run(
            driver.prepare([*overrides, "checkpoint.enabled=false"], run_dir), run_dir, console=False
        )
        # precision=16-mixed is GPU-only: the plugin Lightning builds for it, with a scaler for the CPU
        built.trainer.strategy.precision_plugin = MixedPrecision(
            "16-mixed", "cpu", torch.amp.GradScaler("cpu")
        )
        try:
            built.trainer.fit(built.module, datamodule=built.datamodule)
        finally:
            built.recorder.close()
        assert built.trainer.optimizers[0].defaults["fused"] is (fused == "true")
        logged[fused] = [float(row["grad_norm"]) for row in metrics(run_dir)]
    assert len(logged["true"]) == 3
    assert logged["true"] == pytest.approx(logged["false"], rel=1e-3)


def test_a_stalled_non_zero_rank_exits_only_after_rank_0_recorded_the_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: rank 1 left first and torchrun SIGTERMed rank 0 before summary.json named the stall."""
    import threading
    import time

    from blocks.runtime import health

    exits: list[tuple[int, float]] = []
    recorded: list[float] = []
    monkeypatch.setattr(health.os, "_exit", lambda code: exits.append((code, time.monotonic())))
    watchdogs = []
    for rank in (0, 1):

        def on_stall(reason: str, step: int) -> None:
            time.sleep(1.0)  # rank 0 is slow to write summary.json (a loaded machine)
            recorded.append(time.monotonic())

        watchdog = health.StallWatchdog(5, tmp_path, on_stall=on_stall, grace_s=10)
        watchdog._rank, watchdog._world_size = rank, 2
        watchdogs.append(watchdog)
    threads = [threading.Thread(target=w._fire, args=(6.0,)) for w in reversed(watchdogs)]  # rank 1 first
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(exits) == 2 and len(recorded) == 1
    assert all(code == health.STALL_EXIT_CODE for code, _ in exits)
    assert min(at for _, at in exits) >= recorded[0], "no rank exits before rank 0 has recorded the stall"


def test_a_stall_in_one_run_does_not_silence_the_next_run_in_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a process-wide "stalled" flag, once set, kept every later in-process run from writing summary.json."""
    from blocks.runtime import health

    monkeypatch.setattr(health.os, "_exit", lambda code: None)
    stalled = health.StallWatchdog(5, tmp_path / "stalled", on_stall=lambda reason, step: None, grace_s=0)
    stalled._fire(6.0)

    summary = driver.run([*BLOBS, "trainer.max_steps=2"], tmp_path / "next")
    assert summary.status == "completed"
    assert read_summary(tmp_path / "next")["status"] == "completed"


def test_a_resumed_runs_console_eta_counts_only_the_steps_it_took(capsys: pytest.CaptureFixture[str]) -> None:
    """The ETA divided this session's seconds by every step since 0, the checkpoint's 90 included:
    10 s for 5 steps with 5 to go said 1 s left, not 10."""
    import time

    from blocks.monitor.sinks import ConsoleSink

    sink = ConsoleSink(100, "lines", start_step=90)
    sink.started = time.monotonic() - 10.0
    sink.write(95, {"train/loss": 1.0})
    assert re.search(r"step 95/100 .* eta=(10|11)s$", capsys.readouterr().out.strip())


def test_a_worker_of_rank_1_starts_no_logger_run_before_the_trainer_knows_its_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: Lightning reads the rank at import (``RANK``, ``SLURM_PROCID``... never mpirun's
    ``OMPI_COMM_WORLD_RANK``) and only the Trainer sets it again, so a worker whose rank Lightning's
    import missed (mpirun's, or one forked after the import, as here) started its own logger runs."""
    from pytorch_lightning.utilities.rank_zero import rank_zero_only

    from blocks.runtime.trainer import build_run

    monkeypatch.setattr(rank_zero_only, "rank", 0, raising=False)  # what the import found; put back after
    for name in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    slurm = {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_PROCID": "1"}
    for name, value in {
        **slurm,
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NAME": "train",
    }.items():
        monkeypatch.setenv(name, value)
    database = tmp_path / "mlflow.db"
    overrides = [*BLOBS, "strategy=ddp", "trainer.devices=2", mlflow_logger(database, "ranks")]
    build_run(driver.prepare(overrides, tmp_path / "run"), tmp_path / "run", console=False)
    assert rank_zero_only.rank == 1
    assert mlflow_statuses(database, "ranks") == [], "only global rank 0 starts logger runs"
    assert not (tmp_path / "run" / "loggers.json").exists()
