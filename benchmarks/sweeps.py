"""Sweeps: the overhead per job of a ``blocks run -m`` sweep beyond its jobs' own training time.

Overhead per job = (wall time of the whole sweep - sum of the jobs' ``wall_s``) / jobs, for
Hydra's basic (sequential) launcher and for the joblib launcher (2 jobs at a time).
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
    """Per-job overhead, sequential and with joblib."""
    jobs = 4 if quick else 8
    figures = []
    for name, launcher in (
        ("basic (sequential)", []),
        ("joblib, 2 at a time", ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]),
    ):
        wall, trained = sweep(jobs, root, launcher)
        figures.append(
            Figure(
                "sweeps",
                f"overhead per job, {jobs}-job sweep, {name}",
                (wall - trained) / jobs,
                unit="s",
                detail={"sweep_wall_s": round(wall, 2), "jobs_wall_s": round(trained, 2)},
            )
        )
    return figures
