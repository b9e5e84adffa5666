"""``blocks run`` through the real CLI and Hydra: single runs and sweeps.

Interruption (SIGINT, SIGTERM) of a one-process ``blocks run``: test_faults_processes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import read_summary

FAST = ["recipe=blobs", "data.samples=512", "trainer.max_epochs=1"]


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything but tab and newline: no \r, no ANSI escapes


def test_a_run_without_a_terminal_writes_one_run_dir_and_prints_plain_lines(cli, tmp_path: Path) -> None:
    """One ``blocks run`` as a user starts it, without a terminal and without ``hydra.run.dir``:

    - one run dir, under ``outputs/<recipe>/``, with config.yaml, metrics.csv and a completed summary;
    - the plan, then ``run dir: ...``, printed before the first step line;
    - plain progress lines (no ``\\r``, no ANSI escapes) every ``monitor.log_every_n_steps`` steps,
      with loss, lr, samples/s and eta, and the run summary at the end.

    (Three tests ran this process before: one here with ``hydra.run.dir``, one here for the
    default run dir, one in test_monitor for the plain lines.)
    """
    result = cli("run", "recipe=blobs", "trainer.max_steps=4", "monitor.log_every_n_steps=2")
    assert result.returncode == 0, result.output
    assert not CONTROL.search(result.output), repr(CONTROL.search(result.output))
    (run_dir,) = (tmp_path / "outputs" / "blobs").iterdir()
    assert read_summary(run_dir)["status"] == "completed"
    assert (run_dir / "config.yaml").is_file() and (run_dir / "metrics.csv").is_file()
    assert "plan: recipe blobs" in result.stdout
    lines = result.stdout.splitlines()
    printed = [line for line in lines if line.startswith("run dir: ")]
    assert printed == [f"run dir: {run_dir}"]
    steps = [line for line in lines if line.startswith("step ")]
    assert lines.index(printed[0]) < lines.index(steps[0])
    assert [line.split()[1] for line in steps[:2]] == ["2/4", "4/4"]
    assert "loss=" in steps[0] and "lr=" in steps[0] and "samples/s=" in steps[0] and "eta=" in steps[0]
    assert "run summary" in result.stdout and "completed" in result.stdout


def test_sweep_gives_one_run_dir_per_job(cli_in_process, tmp_path: Path) -> None:
    """Through the console script's entry and Hydra's multirun, in this process: what a sweep writes
    (a run dir per job, each job's own blocks) does not depend on a fresh process, and the test
    above already starts one. Its ``hydra.sweep.subdir`` has two levels (``<optim>/<lr>``)."""
    sweep = tmp_path / "sweep"
    result = cli_in_process(
        "run",
        "-m",
        *FAST,
        "optim=adamw,sgd",
        "optim.lr=0.01,0.003",
        "monitor.progress=off",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=${hydra.runtime.choices.optim}/${optim.lr}",
    )
    assert result.returncode == 0, result.output
    names = ["adamw/0.01", "adamw/0.003", "sgd/0.01", "sgd/0.003"]  # in job order
    job_dirs = [sweep / name for name in names]
    assert sorted(f"{p.parent.name}/{p.name}" for p in sweep.glob("*/*") if p.is_dir()) == sorted(names)
    seen = set()
    for job_dir in job_dirs:
        assert read_summary(job_dir)["status"] == "completed"
        optim = json.loads((job_dir / "plan.json").read_text())["blocks"]["optim"]
        seen.add((optim["block"], optim["fields"]["lr"]))
    assert seen == {("adamw", 0.01), ("adamw", 0.003), ("sgd", 0.01), ("sgd", 0.003)}
    assert not (tmp_path / "outputs").exists(), "no stray run dirs outside the sweep dir"
    # regression: a sweep printed no dir at all (a single run prints its `run dir:`)
    lines = result.output.splitlines()
    assert [line for line in lines if line.startswith("run dir: ")] == [f"run dir: {p}" for p in job_dirs]
    # regression: each job's run dir's parent was taken for its sweep dir (`sweep dirs: .../adamw,
    # .../sgd (its multirun.yaml is in ...)`), wrong for a subdir of several levels
    assert [line for line in lines if line.startswith("sweep dir")] == [f"sweep dir: {sweep}"], result.output
    # regression: `blocks report` of that sweep dir looked for job dirs one level below it only
    result = cli_in_process("report", str(sweep))
    assert result.returncode == 0, result.output
    rows = (sweep / "report" / "report.md").read_text().splitlines()
    jobs = sorted(row.split("|")[2].strip() for row in rows if row.startswith("| ") and "completed" in row)
    assert jobs == sorted(names), rows
