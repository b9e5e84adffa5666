"""Interleaved repetitions, medians and the result rows every suite reports."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")
FIRST_STEP_FILE_ENV = "BLOCKS_BENCHMARK_FIRST_STEP_FILE"
"""Where :class:`benchmarks.first_step_clock.FirstStepClock` writes the time its process's first step ended."""


@dataclass
class Figure:
    """One reported number, with the target it is judged against.

    Attributes:
        suite: which benchmark measured it (``overhead``, ``plan``, ...).
        name: what it is, e.g. ``blocks / plain torch, small MLP``.
        value: the measured number (a ratio unless ``unit`` says otherwise).
        unit: ``x`` for ratios, ``s`` for seconds, ...
        target: the bound the value must meet, e.g. ``>= 0.75``; empty when informative only.
        met: whether the target is met; None without a target.
        detail: the raw numbers behind the ratio.
    """

    suite: str
    name: str
    value: float
    unit: str = "x"
    target: str = ""
    met: bool | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``results/*.json``."""
        return asdict(self)


def judged(suite: str, name: str, value: float, target: str, unit: str = "x", **detail: Any) -> Figure:
    """A figure checked against *target* (``>= X`` or ``<= X``)."""
    op, bound = target.split()
    met = value >= float(bound) if op == ">=" else value <= float(bound)
    return Figure(suite, name, value, unit, target, met, detail)


def interleaved(cases: Mapping[str, Callable[[], T]], repeats: int) -> dict[str, list[T]]:
    """Run every case once per round, *repeats* rounds, rotating the order; each returns a measurement."""
    names = list(cases)
    results: dict[str, list[T]] = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(cases[name]())
    return results


def rounded(
    measurements: Mapping[str, Sequence[float]], digits: int, suffix: str = ""
) -> dict[str, list[float]]:
    """Every case's raw measurements, rounded for the results file, keyed ``<case><suffix>``."""
    return {f"{name}{suffix}": [round(v, digits) for v in values] for name, values in measurements.items()}


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of per-round ratios (rounds were measured back to back, so they pair up)."""
    return statistics.median(a / b for a, b in zip(numerators, denominators, strict=True))


def timed_subprocess(args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> float:
    """Wall seconds of a command that must succeed."""
    import os

    started = time.perf_counter()
    proc = subprocess.run(
        list(args), cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def timed_first_step(
    args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None
) -> tuple[float, float]:
    """Wall seconds from starting a command that must succeed to the end of its first training step, and to its exit.

    The command's training loads :class:`benchmarks.first_step_clock.FirstStepClock`, which
    writes the time its first step ended to the file named by :data:`FIRST_STEP_FILE_ENV`.
    """
    clock = cwd / "first_step_end"
    clock.unlink(missing_ok=True)
    started = time.time()
    exited = timed_subprocess(args, cwd, {**(env or {}), FIRST_STEP_FILE_ENV: str(clock)})
    if not clock.exists():
        raise RuntimeError(f"{' '.join(args)} never ended a training step (no {clock})")
    return float(clock.read_text()) - started, exited


def compile_bytecode() -> None:
    """Compile ``blocks``' modules to bytecode, as installing a package does.

    Start-up is compared with Hydra and Lightning, whose installed modules come compiled. An
    editable checkout under ``PYTHONDONTWRITEBYTECODE`` (set on some CI and sandbox machines)
    never writes ``__pycache__``, so every fresh process would compile ``blocks`` from source.
    """
    import compileall

    compileall.compile_dir(REPO / "blocks", quiet=1)


def python(*args: str) -> list[str]:
    """A command line running this interpreter."""
    return [sys.executable, *args]


def with_checkout(env: Mapping[str, str]) -> dict[str, str]:
    """*env* with this checkout first on ``PYTHONPATH``: child processes import it even where it is not installed."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))}
