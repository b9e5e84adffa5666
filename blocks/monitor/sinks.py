"""Where metric rows go: ``metrics.csv`` and the console (torch-free)."""

from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from blocks.monitor.figures import metric_label, run_throughputs

Row = dict[str, float]


class MetricSink(Protocol):
    """Receives one row per logged step."""

    def write(self, step: int, row: Row) -> None:
        """Record *row* (metric name → value) at optimizer step *step*."""

    def flush(self) -> None:
        """Write out anything buffered."""

    def close(self) -> None:
        """Flush and release resources."""


class CsvSink:
    """``metrics.csv``: a ``step`` column, then one column per metric in order of first appearance.

    Rows at the same step (training, then validation) are merged into one. When a metric
    appears for the first time the file is rewritten with the wider header, which happens a
    handful of times per run.
    """

    def __init__(self, path: Path, *, keep_until_step: int | None = None) -> None:
        self.path = path
        self.columns: list[str] = []
        self.rows: list[tuple[int, Row]] = []
        self._written = 0
        self._keep_until_step = keep_until_step

    def _keep_rows_until(self, step: int) -> None:
        """On resume: keep the rows up to the checkpoint's step, drop those the resumed run will redo."""
        self.columns, rows = read_rows(self.path)
        self.rows = [(at, row) for at, row in rows if at <= step]
        self._rewrite(upto=len(self.rows))

    def write(self, step: int, row: Row) -> None:
        """Buffer *row*; rows of earlier steps are written out."""
        if self._keep_until_step is not None:
            if self.path.exists():
                self._keep_rows_until(self._keep_until_step)
            self._keep_until_step = None
        if self.rows and self.rows[-1][0] == step:
            self.rows[-1][1].update(row)
            if self._written == len(self.rows):  # that row is already on disk (flushed for a checkpoint)
                self.columns.extend(name for name in row if name not in self.columns)
                self._rewrite(upto=len(self.rows))
                return
        else:
            self.rows.append((step, dict(row)))
        new = [name for name in row if name not in self.columns]
        if new:
            self.columns.extend(new)
            self._rewrite(upto=len(self.rows) - 1)
        else:
            self._append(upto=len(self.rows) - 1)

    def flush(self) -> None:
        """Write every buffered row (before a checkpoint, so a resume finds every row up to it)."""
        self._append(upto=len(self.rows))

    def close(self) -> None:
        """Write every buffered row."""
        self.flush()

    def _format(self, step: int, row: Row) -> list[str]:
        return [str(step)] + [_fmt(row[c]) if c in row else "" for c in self.columns]

    def _rewrite(self, upto: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["step", *self.columns])
            for step, row in self.rows[:upto]:
                writer.writerow(self._format(step, row))
        self._written = upto

    def _append(self, upto: int) -> None:
        if upto <= self._written:
            return
        if not self.path.exists():
            self._rewrite(upto)
            return
        with self.path.open("a", newline="") as fh:
            writer = csv.writer(fh)
            for step, row in self.rows[self._written : upto]:
                writer.writerow(self._format(step, row))
        self._written = upto


def read_rows(path: Path) -> tuple[list[str], list[tuple[int, Row]]]:
    """A ``metrics.csv``'s metric columns and its rows, each ``(step, {metric: value})`` with its empty cells left out."""
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        columns = [c for c in (reader.fieldnames or []) if c != "step"]
        rows = [(int(r["step"]), {k: float(v) for k, v in r.items() if k != "step" and v}) for r in reader]
    return columns, rows


def row_at(path: Path, step: int) -> Row:
    """What a ``metrics.csv`` holds of *step* (nothing when it has no such row or cannot be read)."""
    try:
        return next((row for at, row in read_rows(path)[1] if at == step), {})
    except (OSError, ValueError, KeyError):
        return {}


def _fmt(value: float) -> str:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    return f"{value:.6g}"


class ConsoleSink:
    """Progress on the console: a live rich bar on a terminal, plain periodic lines otherwise.

    *start_step*: the optimizer step training starts from (a resumed run's checkpoint step): the
    bar starts there and the ETA is measured on the steps taken since.
    """

    def __init__(self, total_steps: int, mode: str = "auto", *, start_step: int = 0) -> None:
        self.total_steps = total_steps
        self.start_step = start_step
        interactive = sys.stdout.isatty()
        self.mode = ("bar" if interactive else "lines") if mode == "auto" else mode
        self.started = time.monotonic()
        self._progress: Any = None
        self._task: Any = None
        self._stats: Row = {}

    def _start_bar(self) -> None:
        """Start the live display on the first row: only global rank 0 writes rows."""
        if self.mode == "bar" and self._progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[stats]}"),
                transient=False,
            )
            self._task = self._progress.add_task(
                "train", total=self.total_steps, completed=self.start_step, stats=""
            )
            self._progress.start()

    def write(self, step: int, row: Row) -> None:
        """Update the bar, or print one line."""
        if self.mode == "off":
            return
        self._stats.update({k: v for k, v in row.items() if k in _SHOWN})
        stats = "  ".join(f"{_LABELS.get(k, k)}={_fmt(self._stats[k])}" for k in _SHOWN if k in self._stats)
        self._start_bar()
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=step, stats=stats)
            return
        elapsed = time.monotonic() - self.started
        print(
            f"step {step}/{self.total_steps}  {stats}  elapsed={elapsed:.0f}s eta={self._eta(step, elapsed):.0f}s",
            flush=True,
        )

    def _eta(self, step: int, elapsed: float) -> float:
        """Seconds left at this session's pace: *elapsed* over the steps taken since :attr:`start_step`."""
        taken = step - self.start_step
        return elapsed / taken * (self.total_steps - step) if taken > 0 else 0.0

    def flush(self) -> None:
        """Nothing is buffered on the console."""

    def close(self) -> None:
        """Stop the live display."""
        if self._progress is not None:
            self._progress.stop()


_SHOWN = ("train/loss", "val/loss", "val/accuracy", "lr", "grad_norm", "samples_per_s", "tokens_per_s", "mfu")
_LABELS = {"train/loss": "loss", "samples_per_s": "samples/s", "tokens_per_s": "tokens/s"}


def summary_table(summary: dict[str, Any]) -> Any:
    """A rich table of how a run ended: status (and reason), steps, time, throughputs, last metrics.

    The whole-run and steady throughputs are labelled so; a metric of one logging window
    (``samples_per_s``, ``mfu``, ...) is labelled as the last window's.

    Every value is plain text, never markup: a failure reason quotes user input and exception
    messages, which may hold ``[/...]``.
    """
    from rich.table import Table
    from rich.text import Text

    status = str(summary.get("status"))
    style = "green" if status == "completed" else "red"
    table = Table(title="run summary", show_header=False, title_justify="left")
    table.add_column("key", style="bold")
    table.add_column("value")

    def row(key: str, value: str, value_style: str = "") -> None:
        table.add_row(Text(key), Text(value, style=value_style))

    row("status", status, style)
    if summary.get("reason"):
        row("reason", str(summary["reason"]))
    row("steps", str(summary.get("global_step", 0)))
    row("wall time (this attempt)", f"{summary.get('wall_s', 0.0):.1f}s")
    if summary.get("train_s"):
        row("training time (whole run)", f"{summary['train_s']:.1f}s")
    for label, value in run_throughputs(summary):
        row(label, _fmt(value))
    if summary.get("resumed_from"):
        row("resumed from", str(summary["resumed_from"]))
    for name, value in summary.get("metrics", {}).items():
        if name.startswith(("train/loss_rank",)):
            continue
        row(metric_label(str(name)), _fmt(value))
    return table
