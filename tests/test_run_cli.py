"""``blocks run`` through the real CLI and Hydra: single runs and sweeps.

Interruption (SIGINT, SIGTERM) of a one-process ``blocks run``: test_faults_processes.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import read_summary

FAST = ["recipe=blobs", "data.samples=512", "trainer.max_epochs=1"]


def test_run_writes_one_run_dir(cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = cli("run", *FAST, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.output
    assert "plan: recipe blobs" in result.stdout
    assert "step " in result.stdout  # plain progress lines without a terminal
    assert "\x1b[" not in result.stdout
    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    assert (run_dir / "config.yaml").is_file() and (run_dir / "metrics.csv").is_file()


def test_default_run_dir_is_under_outputs_and_printed_before_training(cli, tmp_path: Path) -> None:
    result = cli("run", *FAST, "monitor.log_every_n_steps=1")
    assert result.returncode == 0, result.output
    (run_dir,) = (tmp_path / "outputs" / "blobs").iterdir()
    assert read_summary(run_dir)["status"] == "completed"
    lines = result.stdout.splitlines()
    printed = [line for line in lines if line.startswith("run dir: ")]
    assert printed == [f"run dir: {run_dir}"]
    first_step = next(i for i, line in enumerate(lines) if line.startswith("step "))
    assert lines.index(printed[0]) < first_step


def test_sweep_gives_one_run_dir_per_job(cli, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    result = cli(
        "run",
        "-m",
        *FAST,
        "optim=adamw,sgd",
        "optim.lr=0.01,0.003",
        "monitor.progress=off",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.output
    job_dirs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in job_dirs] == ["0", "1", "2", "3"]
    seen = set()
    for job_dir in job_dirs:
        assert read_summary(job_dir)["status"] == "completed"
        optim = json.loads((job_dir / "plan.json").read_text())["blocks"]["optim"]
        seen.add((optim["block"], optim["fields"]["lr"]))
    assert seen == {("adamw", 0.01), ("adamw", 0.003), ("sgd", 0.01), ("sgd", 0.003)}
    assert not (tmp_path / "outputs").exists(), "no stray run dirs outside the sweep dir"
