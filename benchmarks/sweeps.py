"""Sweeps: what each job of a ``blocks run -m`` sweep costs beyond its own training time.

A sweep of one job and a sweep of N jobs run with each launcher; the overhead per extra job is
the difference of their wall times less the difference of their jobs' own ``wall_s``, over
N - 1. The process start (interpreter, torch and Lightning imports: seconds of CPU) is paid
once per sweep, so it cancels out; it is reported on its own as the one-job sweep's wall time
beyond its job's training. Hydra's basic (sequential) launcher and the joblib launcher (2 jobs
at a time).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from benchmarks.harness import Figure, python, timed_subprocess

JOB = [
    "recipe=blobs",
    "data.samples=512",
    "trainer.max_epochs=1",
    "checkpoint.enabled=false",
    "monitor.progress=off",
]


def sweep(jobs: int, root: Path, launcher: list[str]) -> tuple[float, float]:
    """(wall seconds of the sweep, sum of the jobs' own wall_s)."""
    sweep_dir = Path(tempfile.mkdtemp(dir=root))
    seeds = ",".join(str(seed) for seed in range(jobs))
    args = python(
        "-m", "blocks", "run", "-m", *JOB, f"trainer.seed={seeds}", f"hydra.sweep.dir={sweep_dir}", *launcher
    )
    wall = timed_subprocess(args, root)
    summaries = [json.loads(p.read_text()) for p in sweep_dir.glob("*/summary.json")]
    if len(summaries) != jobs:
        raise RuntimeError(f"expected {jobs} job summaries in {sweep_dir}, found {len(summaries)}")
    return wall, sum(s["wall_s"] for s in summaries)


def run(quick: bool, root: Path) -> list[Figure]:
    """Overhead per extra job, sequential and with joblib, and the sweep's one-off start."""
    jobs = 4 if quick else 8
    figures = []
    for name, launcher in (
        ("basic (sequential)", []),
        ("joblib, 2 at a time", ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]),
    ):
        one_wall, one_trained = sweep(1, root, launcher)
        wall, trained = sweep(jobs, root, launcher)
        detail = {
            "sweep_wall_s": round(wall, 2),
            "jobs_wall_s": round(trained, 2),
            "one_job_sweep_wall_s": round(one_wall, 2),
            "one_job_wall_s": round(one_trained, 2),
        }
        figures += [
            Figure(
                "sweeps",
                f"overhead per extra job, {jobs}-job sweep, {name}",
                ((wall - one_wall) - (trained - one_trained)) / (jobs - 1),
                unit="s",
                detail=detail,
            ),
            Figure(
                "sweeps",
                f"sweep start (process, imports, first compose), {name}",
                one_wall - one_trained,
                unit="s",
                detail=detail,
            ),
        ]
    return figures
