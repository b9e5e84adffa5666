"""The Markdown table of a benchmark run (also published in the docs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.harness import Figure


def markdown(figures: list[Figure], meta: Mapping[str, Any]) -> str:
    """One table per suite: figure, value, target, verdict."""
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    lines = [
        f"Measured {meta['date']} on {meta['cpus']} CPU(s) ({meta['machine']}), Python {meta['python']}, "
        f"{versions}; {'quick' if meta['quick'] else 'full'} mode, {meta['wall_s']:.0f} s in all"
        + (
            f"; load average {meta['load_average'][0]} before, {meta['load_average'][1]} after."
            if meta.get("load_average")
            else "."
        ),
        "",
    ]
    for suite in dict.fromkeys(f.suite for f in figures):
        lines += [f"### {suite}", "", "| figure | value | target | |", "|---|---|---|---|"]
        for f in (f for f in figures if f.suite == suite):
            verdict = "" if f.met is None else ("met" if f.met else "**missed**")
            lines.append(f"| {f.name} | {f.value:.3g}{f.unit} | {f.target} | {verdict} |")
        lines.append("")
    return "\n".join(lines)
