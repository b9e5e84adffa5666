"""How a run's ``summary.json`` figures are shown and judged: its throughputs, the last window's metrics, the objective (torch-free).

``summary.json`` has three throughputs of one name: ``samples_per_s`` (the whole run's average),
``steady_samples_per_s`` (without warm-up, validation and saves) and ``metrics.samples_per_s``
(the last logging window). The console summary and ``blocks report`` show each under a label that
says which it is, and a sweep over ``monitor.objective=samples_per_s`` gets the steady figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RUN_THROUGHPUTS = (
    ("samples_per_s", "samples/s (whole run)"),
    ("steady_samples_per_s", "samples/s (steady)"),
    ("tokens_per_s", "tokens/s (whole run)"),
    ("steady_tokens_per_s", "tokens/s (steady)"),
)
"""The whole-run and steady throughputs of ``summary.json`` and how they are labelled."""

LAST_WINDOW_METRICS = ("samples_per_s", "tokens_per_s", "step_time_s", "data_wait_s", "tflops_per_s", "mfu")
"""Metrics of ``metrics.csv`` rows measured over one logging window: ``summary.json``'s value is the last window's."""

THROUGHPUT_OBJECTIVES = {
    "samples_per_s": ("steady_samples_per_s", "samples_per_s"),
    "tokens_per_s": ("steady_tokens_per_s", "tokens_per_s"),
}
"""For an objective that names a throughput, the ``summary.json`` fields it is, the first one present."""


def run_throughputs(summary: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The whole-run and steady throughputs *summary* has, as (label, value)."""
    return [(label, float(summary[name])) for name, label in RUN_THROUGHPUTS if summary.get(name)]


def metric_label(name: str) -> str:
    """*name* as a summary shows it: a metric of one logging window says it is the last window's."""
    return f"{name} (last window)" if name in LAST_WINDOW_METRICS else name


def objective_value(summary: Mapping[str, Any], name: str) -> float | None:
    """The value of objective *name* for a run's ``summary.json`` (None when it has none).

    A throughput (``samples_per_s``, ``tokens_per_s``) is the steady figure, else the whole
    run's when fewer than two windows were logged: the last window alone says little about a
    configuration. Any other metric is its last logged value (``val/loss`` the last validation's,
    not the best one).
    """
    for field in THROUGHPUT_OBJECTIVES.get(name, ()):
        if summary.get(field):
            return float(summary[field])
    value = (summary.get("metrics") or {}).get(name)
    return None if value is None else float(value)
