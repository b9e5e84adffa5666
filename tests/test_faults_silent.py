"""Silent wrong answers: a loss that explodes without reaching NaN, MFU against the wrong peak."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
from pathlib import Path

import pytest

from blocks.launch import driver
from blocks.runtime.metrics import peak_flops_for
from tests.conftest import read_summary, run_in_process

pytestmark = pytest.mark.timeout(600)

EXPLODING = [
    "recipe=blobs",
    "monitor.progress=off",
    "optim.lr=1e3",
    "monitor.grad_norm=false",  # only the loss is left to tell: it is finite, 1e34, at step 10
    "trainer.max_steps=10",
]


def test_a_diverging_loss_fails_the_run_under_stop(tmp_path: Path) -> None:
    result = run_in_process(["run", *EXPLODING, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert result.returncode == 1, result.output[-2000:]
    assert "Traceback" not in result.output
    summary = read_summary(tmp_path / "run")
    assert summary["status"] == "failed"
    assert "monitor.loss_divergence_factor=100" in summary["reason"]
    assert "diverged" in summary["reason"]


def test_a_diverging_loss_warns_under_skip(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        summary = driver.run(
            [*EXPLODING, "monitor.on_nonfinite=skip", "monitor.log_every_n_steps=1"], tmp_path
        )
    assert summary.status == "completed"
    assert summary.metrics["health/divergences"] >= 1
    assert "training diverged" in caplog.text


def test_a_healthy_run_is_not_called_diverging(tmp_path: Path) -> None:
    summary = driver.run(["recipe=blobs", "monitor.progress=off", "monitor.log_every_n_steps=1"], tmp_path)
    assert summary.status == "completed"
    assert "health/divergences" not in summary.metrics


def test_a_non_finite_first_step_does_not_turn_the_divergence_check_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: step 1's NaN loss (NaN inputs) became the divergence baseline, and a NaN baseline
    judged nothing for the rest of the run. The skipped step is left out: step 2's loss is the
    baseline (the first row with a loss), and the exploding loss after it is divergence."""
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    run_dir = tmp_path / "run"
    result = run_in_process(
        [
            "run",
            "recipe=blobs",
            "optim=sgd",
            "optim.lr=20",
            "optim.grad_clip=null",
            "trainer.max_steps=30",
            "trainer.max_epochs=null",
            "monitor.on_nonfinite=skip",
            "monitor.max_bad_steps=0",
            "monitor.loss_divergence_factor=3",
            "monitor.log_every_n_steps=1",
            "monitor.progress=off",
            "checkpoint.enabled=false",
            f"hydra.run.dir={run_dir}",
            "trainer.callbacks=[{_target_: tests.lightning_habits.NaNInput, steps: [1]}]",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.output[-2000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    assert summary["metrics"]["health/divergences"] >= 1
    baseline = re.search(r"first counted step's loss (\S+): training diverged", result.output)
    assert baseline is not None, result.output[-2000:]
    with (run_dir / "metrics.csv").open(newline="") as fh:
        first_logged = next(float(row["train/loss"]) for row in csv.DictReader(fh) if row["train/loss"])
    assert float(baseline.group(1)) == pytest.approx(first_logged, rel=1e-3)


def test_the_divergence_factor_is_checked_at_plan_time(tmp_path: Path) -> None:
    result = run_in_process(["plan", "recipe=blobs", "monitor.loss_divergence_factor=0.5"], cwd=tmp_path)
    assert result.returncode == 2
    assert "monitor.loss_divergence_factor" in result.output


@pytest.mark.parametrize(
    ("precision", "tflops"),
    [("32-true", 67.0), ("bf16-mixed", 989.0), ("bf16-true", 989.0), ("16-mixed", 989.0)],
)
def test_mfu_divides_by_the_peak_of_the_runs_precision(precision: str, tflops: float) -> None:
    assert peak_flops_for("NVIDIA H100 80GB HBM3", precision) == pytest.approx(tflops * 1e12)


def test_an_unknown_gpu_has_no_peak() -> None:
    assert peak_flops_for("Some Future GPU", "32-true") is None


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_the_metrics_recorder_is_told_the_runs_precision(tmp_path: Path, precision: str) -> None:
    from blocks.runtime.trainer import build_run

    plan = driver.prepare(["recipe=blobs", "monitor.progress=off", f"precision={precision}"], tmp_path)
    assert build_run(plan, tmp_path, console=False).recorder.precision == precision


def test_sweep_jobs_may_not_share_a_checkpoint_dir(tmp_path: Path) -> None:
    """Every job resumes from the newest checkpoint in its checkpoint.dir: sharing one, the second
    trial of ``optim.lr=0.001,0.01`` resumed the first's final step, trained nothing, and reported
    the first trial's model as its own."""
    shared = tmp_path / "shared"
    sweep = ["-m", "recipe=blobs", "trainer.max_steps=2", "optim.lr=0.001,0.01", "monitor.progress=off"]
    for command in ("plan", "run"):
        args = [command, *sweep, f"checkpoint.dir={shared}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
        result = run_in_process(args, cwd=tmp_path)
        assert result.returncode == 2, result.output[-3000:]
        assert "error checkpoint.dir:" in result.output and "resume from each other" in result.output
    assert not shared.exists() and not (tmp_path / "sweep").exists()
    as_json = run_in_process(["plan", *sweep, f"checkpoint.dir={shared}", "--json"], cwd=tmp_path)
    assert as_json.returncode == 2
    jobs = json.loads(as_json.stdout)
    assert [job["valid"] for job in jobs] == [False, False]
    assert all(any(p["key"] == "checkpoint.dir" for p in job["problems"]) for job in jobs)
    per_job = run_in_process(["plan", *sweep, f"checkpoint.dir={shared}/lr${{optim.lr}}"], cwd=tmp_path)
    assert per_job.returncode == 0, per_job.output[-3000:]


def test_sweep_jobs_may_not_share_a_checkpoint_dir_spelled_two_ways(tmp_path: Path) -> None:
    """``checkpoint.dir=C/a,C/b/../a`` names one directory twice: compared as strings, the two passed
    the precheck and job 1 resumed job 0's final checkpoint."""
    ck = tmp_path / "ck"
    sweep = ["-m", "recipe=blobs", "trainer.max_steps=2", "monitor.progress=off"]
    result = run_in_process(["plan", *sweep, f"checkpoint.dir={ck}/a,{ck}/b/../a"], cwd=tmp_path)
    assert result.returncode == 2, result.output[-3000:]
    assert f"would keep their checkpoints in {ck / 'a'} and resume" in " ".join(result.output.split())
    relative = run_in_process(["plan", *sweep, "checkpoint.dir=ck/a,./ck/a/"], cwd=tmp_path)
    assert relative.returncode == 2, relative.output[-3000:]
    urls = run_in_process(["plan", *sweep, "checkpoint.dir=memory://ck/a,memory://ck/a/"], cwd=tmp_path)
    assert urls.returncode == 2, urls.output[-3000:]


SEARCH = ["-m", "hparams_search=optuna", "recipe=blobs", "hydra.sweeper.n_trials=2", "monitor.progress=off"]


def test_a_search_whose_trials_share_a_checkpoint_dir_is_refused(tmp_path: Path) -> None:
    """An Optuna search with a fixed checkpoint.dir passed the precheck: trial 1 resumed trial 0's final
    checkpoint (saved with another lr and weight decay), trained nothing, and its empty objective
    crashed the sweeper."""
    shared = tmp_path / "shared"
    for command in ("plan", "run"):
        args = [command, *SEARCH, "trainer.max_steps=2", f"checkpoint.dir={shared}"]
        result = run_in_process([*args, f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
        assert result.returncode == 2, result.output[-3000:]
        output = " ".join(result.output.split())
        assert "error checkpoint.dir: every trial of the search would keep its checkpoints in" in output
        assert "(optim.lr, optim.weight_decay)" in output
    assert not shared.exists() and not (tmp_path / "sweep").exists()
    per_trial = f"checkpoint.dir={shared}/lr${{optim.lr}}"
    assert run_in_process(["plan", *SEARCH, per_trial], cwd=tmp_path).returncode == 0


def test_a_later_sweep_does_not_resume_the_checkpoints_of_another_sweeps_jobs(tmp_path: Path) -> None:
    """``checkpoint.dir=<dir>/lr${optim.lr}`` names the swept key, but a second sweep into a new sweep dir
    that changed only optim.weight_decay resumed the first sweep's final checkpoints and completed
    with its weights. Its job is refused; the first sweep's command, run again, still resumes."""
    ck = f"checkpoint.dir={tmp_path / 'ck'}/lr${{optim.lr}}"
    sweep = ["run", "-m", "recipe=blobs", "monitor.progress=off", "trainer.max_steps=2", ck, "optim.lr=1e-3"]
    first = run_in_process(
        [*sweep, "optim.weight_decay=0", f"hydra.sweep.dir={tmp_path / 'a'}"], cwd=tmp_path
    )
    assert first.returncode == 0, first.output[-3000:]
    other = run_in_process(
        [*sweep, "optim.weight_decay=0.1", f"hydra.sweep.dir={tmp_path / 'b'}"], cwd=tmp_path
    )
    assert other.returncode == 1, other.output[-3000:]
    assert "resuming" not in other.output and "Traceback" not in other.output
    summary = read_summary(tmp_path / "b" / "0")
    assert summary["status"] == "failed" and summary["global_step"] == 0
    assert summary["reason"].startswith("checkpoint.dir: ") and "optimizer settings" in summary["reason"]
    again = [*sweep, "optim.weight_decay=0", "trainer.max_steps=3", f"hydra.sweep.dir={tmp_path / 'c'}"]
    rerun = run_in_process(again, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.output[-3000:]
    assert "resuming from step 2" in rerun.output
    assert read_summary(tmp_path / "c" / "0")["global_step"] == 3


def test_a_search_trial_without_an_objective_gets_the_failed_value(tmp_path: Path) -> None:
    """A trial that trained nothing (it resumed a final checkpoint that records no metrics, as an
    older version's, of data without a validation split) completed with no metrics: its objective
    was None and the Optuna sweeper crashed on it, leaving the other trials unrun."""
    single = ["run", "recipe=blobs", "monitor.progress=off", "trainer.max_steps=2", "data.val_fraction=0"]
    assert run_in_process([*single, f"hydra.run.dir={tmp_path / 'one'}"], cwd=tmp_path).returncode == 0
    final = tmp_path / "one" / "checkpoints" / "step-000000002"
    manifest = json.loads((final / "MANIFEST.json").read_text())
    manifest["metrics"] = {}
    (final / "MANIFEST.json").write_text(json.dumps(manifest))
    search = [
        *SEARCH,
        "trainer.max_steps=2",
        "data.val_fraction=0",
        f"checkpoint.resume={final}",
        f"hydra.sweep.dir={tmp_path / 's'}",
    ]
    result = run_in_process(["run", *search], cwd=tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    assert "Traceback" not in result.output and "float-castable" not in result.output
    assert result.output.count("the sweeper is given the value of a failed job") == 2
    assert "best_value: .inf" in (tmp_path / "s" / "optimization_results.yaml").read_text()


def test_sweep_jobs_may_not_share_a_run_dir(tmp_path: Path) -> None:
    """With ``hydra.sweep.subdir=same`` the second job of ``optim.lr=0.01,0.003`` resumed the first's
    checkpoint in the run dir they shared, reported its result as its own, and the sweep exited 0."""
    sweep = ["-m", "recipe=blobs", "trainer.max_steps=2", "optim.lr=0.01,0.003", "monitor.progress=off"]
    for command in ("plan", "run"):
        args = [command, *sweep, f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweep.subdir=same"]
        result = run_in_process(args, cwd=tmp_path)
        assert result.returncode == 2, result.output[-3000:]
        assert (
            f"error hydra.sweep.subdir: 2 jobs of the sweep would run in {tmp_path / 'sweep' / 'same'}"
            in (" ".join(result.output.split()))
        )
        assert "hydra.sweep.subdir=${hydra.job.num}" in result.output
    assert not (tmp_path / "sweep").exists()
    per_job = [
        "plan",
        *sweep,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.sweep.subdir=${hydra.job.override_dirname}",
    ]
    assert run_in_process(per_job, cwd=tmp_path).returncode == 0


def test_a_sweep_whose_jobs_could_not_start_exits_1_and_each_job_says_why(tmp_path: Path) -> None:
    """A job that failed before training (then its data's preflight, now checkpoint storage it
    cannot write to) wrote no summary, so the sweep counted nothing and exited 0 with no job run."""
    (tmp_path / "a-file").write_text("checkpoint.dir below a file cannot be made\n")
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)  # an earlier sweep into the same dir left its own outcome
    (sweep / "0" / "summary.json").write_text(
        json.dumps({"status": "failed", "reason": "an earlier sweep's"})
    )
    os.utime(sweep / "0" / "summary.json", (1e9, 1e9))
    result = run_in_process(
        [
            "run",
            "-m",
            "recipe=blobs",
            f"checkpoint.dir={tmp_path / 'a-file'}/s${{trainer.seed}}",
            "trainer.max_steps=2",
            "trainer.seed=1,2",
            "monitor.progress=off",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.output[-3000:]
    assert f"2 job(s) of the sweep did not complete: {sweep / '0'}, {sweep / '1'}" in result.output
    for job in ("0", "1"):
        summary = read_summary(sweep / job)
        assert summary["status"] == "failed" and summary["global_step"] == 0
        assert summary["reason"].startswith("checkpoint.dir: checkpoints cannot be written"), summary[
            "reason"
        ]


def test_a_sweep_over_data_one_job_cannot_read_is_refused_before_any_job_starts(tmp_path: Path) -> None:
    """A single run over shards missing from storage is refused before it starts; the sweep's precheck
    skipped the data's preflight, said "all valid", trained job 0 and failed job 1."""
    from blocks.data.shards.manifest import MANIFEST
    from blocks.data.shards.prepare import PrepareOptions, prepare

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "doc.txt").write_text("the same few words, again and again. " * 8)
    prepare(str(corpus), str(tmp_path / "shards"), PrepareOptions(val_fraction=0, shard_tokens=25, workers=1))
    manifest_only = tmp_path / "manifest-only"
    manifest_only.mkdir()
    (manifest_only / MANIFEST).write_bytes((tmp_path / "shards" / MANIFEST).read_bytes())
    sweep = tmp_path / "sweep"
    result = run_in_process(
        [
            "run",
            "-m",
            "recipe=tiny_lm",
            "data=stream",
            f"data.path={tmp_path / 'shards'},{manifest_only}",
            "data.seq_len=4",
            "trainer.val_every=null",
            "monitor.objective=train/loss",
            "trainer.max_steps=2",
            "monitor.progress=off",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.output[-3000:]
    output = " ".join(result.output.split())
    assert f"blocks: job [recipe=tiny_lm data=stream data.path={manifest_only}" in output
    assert "shard file(s) of the manifest are missing" in output and "all valid" not in output
    assert not sweep.exists()


def test_a_sweep_maximizing_a_validation_objective_without_a_validation_split_is_refused(
    tmp_path: Path,
) -> None:
    """Each trial returned train/loss to an Optuna study maximizing val/accuracy, which picked the worst
    model; the plan's warning was not shown by the sweep's precheck, which said "all valid"."""
    sweep = tmp_path / "sweep"
    result = run_in_process(
        [
            "run",
            "-m",
            "hparams_search=optuna",
            "recipe=blobs",
            "monitor.objective=val/accuracy",
            "monitor.objective_mode=max",
            "hydra.sweeper.direction=maximize",
            "data.val_fraction=0",
            "hydra.sweeper.n_trials=2",
            "trainer.max_steps=2",
            "monitor.progress=off",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.output[-3000:]
    output = " ".join(result.output.split())
    assert "error monitor.objective: 'val/accuracy' is never logged" in output
    assert "all valid" not in output and not sweep.exists()


def test_a_sweep_ranking_some_jobs_by_train_loss_is_refused_and_warnings_show_once(tmp_path: Path) -> None:
    """``data.val_fraction=0,0.1`` ranked the jobs without a validation split by train/loss against the
    others' val/loss; the plans' warnings were never shown by the sweep's precheck."""
    sweep = tmp_path / "sweep"
    args = ["-m", "recipe=blobs", "trainer.max_steps=1", "monitor.progress=off", f"hydra.sweep.dir={sweep}"]
    for command in ("plan", "run"):
        mixed = run_in_process([command, *args, "data.val_fraction=0,0.1", "trainer.seed=1,2"], cwd=tmp_path)
        assert mixed.returncode == 2, mixed.output[-3000:]
        output = " ".join(mixed.output.split())
        assert "error monitor.objective: 2 job(s) of the sweep have no validation split" in output
        assert "ranked against the val/loss of the others" in output
    assert output.count("'val/loss' is never logged") == 1, output
    assert not sweep.exists()
    uniform = run_in_process(["run", *args, "data.val_fraction=0", "trainer.seed=1,2"], cwd=tmp_path)
    assert uniform.returncode == 0, uniform.output[-3000:]
    output = " ".join(uniform.output.split())
    assert output.count("warning monitor.objective: 'val/loss' is never logged") == 1, output
    assert "planned 2 job(s): all valid" in output
