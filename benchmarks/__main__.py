"""``python -m benchmarks [--quick] [--only SUITE,...] [--gpu]``: measure, then write JSON and Markdown."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from benchmarks import checkpoints, distributed, overhead, plan_latency, streaming, sweeps
from benchmarks.harness import REPO, Figure
from benchmarks.report import markdown

SUITES: dict[str, Callable[[bool, Path], list[Figure]]] = {
    "overhead": overhead.run,
    "plan": plan_latency.run,
    "distributed": distributed.run,
    "checkpoints": checkpoints.run,
    "sweeps": sweeps.run,
    "streaming": streaming.run,
}


def main(argv: list[str] | None = None) -> int:
    """Run the chosen suites and write ``benchmarks/results/<name>.json`` and ``.md``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repetitions (a few minutes)")
    parser.add_argument("--only", help=f"comma-separated suites out of: {', '.join(SUITES)}")
    parser.add_argument("--gpu", action="store_true", help="run the GPU suite instead (needs an NVIDIA GPU)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="with --gpu: plan every GPU configuration (no GPU needed) and stop",
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="results directory")
    parser.add_argument("--name", help="results file name (default: cpu-quick, cpu or gpu)")
    args = parser.parse_args(argv)
    if args.gpu:
        from benchmarks import gpu

        if args.dry_run:
            planned = gpu.plan_all()
            for entry in planned:
                estimate = f"{entry['estimate_gb']:.1f} GB" if entry["estimate_gb"] else "?"
                print(
                    f"{entry['config']}: {entry['parameters'] / 1e6:.0f}M parameters, plan estimate {estimate}"
                )
                for error in entry["errors"]:
                    print(f"   error: {error}")
            return 1 if any(entry["errors"] for entry in planned) else 0
        chosen: dict[str, Callable[[bool, Path], list[Figure]]] = {"gpu": gpu.run}
    else:
        names = args.only.split(",") if args.only else list(SUITES)
        unknown = [n for n in names if n not in SUITES]
        if unknown:
            parser.error(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)}")
        chosen = {name: SUITES[name] for name in names}
    name = args.name or ("gpu" if args.gpu else "cpu-quick" if args.quick else "cpu")
    figures: list[Figure] = []
    load_before = _load()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="blocks-bench-") as root:
        for suite, run in chosen.items():
            print(f"== {suite}", flush=True)
            suite_started = time.perf_counter()
            new = run(args.quick, Path(root))
            for figure in new:
                verdict = "" if figure.met is None else (" PASS" if figure.met else " MISS")
                print(
                    f"   {figure.name}: {figure.value:.3g}{figure.unit} {figure.target}{verdict}", flush=True
                )
            print(f"   ({time.perf_counter() - suite_started:.0f} s)", flush=True)
            figures += new
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "quick": args.quick,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": _cpus(),
        "versions": _versions(),
        "wall_s": round(time.perf_counter() - started, 1),
        "load_average": [load_before, _load()],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "figures": [f.to_json() for f in figures]}
    (args.out / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (args.out / f"{name}.md").write_text(markdown(figures, meta))
    print(f"wrote {args.out / name}.json and .md")
    return 0 if all(f.met is not False for f in figures) else 1


def _load() -> float:
    """The 1-minute load average (other processes competing for the CPUs), or 0 where unknown."""
    import os

    return round(os.getloadavg()[0], 1) if hasattr(os, "getloadavg") else 0.0


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _versions() -> dict[str, str]:
    """Installed versions; ``not installed`` for one imported from a source tree (a GPU machine's checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "pytorch-lightning", "hydra-core", "blocks"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


if __name__ == "__main__":
    sys.exit(main())
