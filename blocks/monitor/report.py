"""``blocks report``: plots and summary tables of a run dir, a sweep dir or a pipeline dir (torch-free; matplotlib, Agg).

A run dir gets PNG plots of its ``metrics.csv`` (loss and validation curves, throughput, LR,
gradient norm) and a summary table; a sweep dir (the run dirs of a ``blocks run -m``) gets a
table of every job ranked by the objective, plots of the objective against each swept
parameter, and the jobs' loss curves on one plot; a pipeline's dir a table of its stages in
order (from the record the pipeline writes) and its train stages' loss curves. Everything goes to ``<dir>/report/``:
the PNGs, ``report.md`` and ``report.html`` (plots embedded, one file to share).
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocks.monitor.figures import metric_label, objective_value, run_throughputs
from blocks.monitor.pipeline_record import (
    PIPELINE_FILE,
    STAGE_FILE,
    UPSTREAM_FILE,
    read_stages,
    upstream_changes,
    upstream_result,
)
from blocks.spec.errors import BlocksError, Problem

REPORT_DIR = "report"
FIGSIZE = (8.0, 4.5)
DPI = 100
"""Every plot is ``FIGSIZE × DPI`` = 800 × 450 pixels."""

RUN_PLOTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "loss": ("Loss", ("train/loss", "val/loss")),
    "throughput": ("Throughput (samples/s)", ("samples_per_s",)),
    "lr": ("Learning rate", ("lr",)),
    "grad_norm": ("Gradient norm (before clipping)", ("grad_norm",)),
    "memory": ("Peak memory (MiB)", ("peak_memory_mb",)),
}
LAST_WINDOW_SHOWN = ("samples_per_s", "tokens_per_s", "mfu")
"""Metrics of the last logging window a run's summary table shows (labelled as such)."""


@dataclass
class RunData:
    """What a report reads from one run dir."""

    path: Path
    summary: dict[str, Any]
    columns: dict[str, list[tuple[int, float]]]
    config: dict[str, Any] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        """The run's status, ``unknown`` without a ``summary.json``."""
        return str(self.summary.get("status", "unknown"))

    def final(self, name: str, *, steady_throughput: bool = True) -> float | None:
        """The value of metric *name*: from ``summary.json``, else the last row of ``metrics.csv`` that has it.

        With *steady_throughput* (an objective's value), a throughput is the whole run's steady
        figure (see :func:`objective_value`); without, the last window's, as the run logged it.
        """
        if steady_throughput:
            value = objective_value(self.summary, name)
        else:
            value = (self.summary.get("metrics") or {}).get(name)
        if value is None and self.columns.get(name):
            value = self.columns[name][-1][1]
        return None if value is None else float(value)


def is_run_dir(path: Path) -> bool:
    """A run dir has the job files the driver writes."""
    return (path / "config.yaml").exists() or (path / "summary.json").exists()


def _written_run_dir(path: Path) -> bool:
    """A run dir by the files only blocks writes (``summary.json``; ``plan.json``, beside ``config.yaml``).

    A ``config.yaml`` alone is no sign of a job: a Hydra config dir (``conf/config.yaml``) has one too.
    """
    return (path / "summary.json").exists() or (path / "plan.json").exists()


def read_run(path: Path) -> RunData:
    """Read ``summary.json``, ``metrics.csv``, ``config.yaml`` and Hydra's ``overrides.yaml`` of a run dir."""
    summary: dict[str, Any] = {}
    if (path / "summary.json").exists():
        summary = _json_file(path / "summary.json")
    columns: dict[str, list[tuple[int, float]]] = {}
    if (path / "metrics.csv").exists():
        with (path / "metrics.csv").open(newline="") as fh:
            for record in csv.DictReader(fh):
                step = int(record["step"])
                for name, value in record.items():
                    if name != "step" and value:
                        columns.setdefault(name, []).append((step, float(value)))
    config: dict[str, Any] = {}
    overrides: list[str] = []
    if (path / "config.yaml").exists():
        config = _yaml_file(path / "config.yaml") or {}
    hydra_overrides = path / ".hydra" / "overrides.yaml"
    if hydra_overrides.exists():
        overrides = [str(o) for o in _yaml_file(hydra_overrides) or []]
    return RunData(path, summary, columns, config, overrides)


def _json_file(file: Path) -> dict[str, Any]:
    """The JSON object in *file*; a clear error naming the file when it is not one (a truncated file)."""
    try:
        value = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        value = exc
    if not isinstance(value, dict):
        raise BlocksError(
            Problem(
                "RUN_DIR",
                f"{file} is not a file blocks wrote (not a JSON object: {value})",
                "run the job again to rewrite it, or remove the file",
            )
        )
    return value


def _yaml_file(file: Path) -> Any:
    """The plain YAML in *file* (no tags that build objects); a clear error when it is not."""
    import yaml

    try:
        return yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise BlocksError(
            Problem(
                "RUN_DIR",
                f"{file} is not a file blocks wrote: {exc}",
                "pass a run dir or a sweep dir blocks wrote",
            )
        ) from None


def write_report(path: Path, *, objective: str | None = None, mode: str | None = None) -> Path:
    """Write the report of the run dir, sweep dir or pipeline dir *path*; returns the report's directory."""
    if not path.is_dir():
        raise BlocksError(Problem("RUN_DIR", f"{path} is not a directory", "pass a run dir or a sweep dir"))
    if is_run_dir(path):
        return _run_report(read_run(path))
    if (path / PIPELINE_FILE).is_file():
        return _pipeline_report(path, read_stages(path))
    jobs, pipelines = _sweep_jobs(path)
    if not jobs and pipelines:
        raise BlocksError(
            Problem(
                "RUN_DIR",
                f"{path} holds no run dirs but the dirs of pipelines ({', '.join(_job_name(path, p) for p in pipelines)}),"
                " each reported on its own",
                f"report a pipeline: blocks report {pipelines[0]}",
            )
        )
    if not jobs:
        raise BlocksError(
            Problem(
                "RUN_DIR",
                f"{path} is neither a run dir (config.yaml, summary.json) nor a sweep dir of run dirs",
                "pass the directory `blocks run` printed, or a sweep's hydra.sweep.dir",
            )
        )
    # Only stages right below *path* make it a pipeline's dir; a stage deeper down is some other pipeline's.
    staged = [
        _job_name(path, p)
        for p in jobs
        if p.parent == path and ((p / STAGE_FILE).is_file() or (p / UPSTREAM_FILE).is_file())
    ]
    if staged:  # a pipeline's dir from before it recorded its stages: its stages are no sweep's jobs
        raise BlocksError(
            Problem(
                "RUN_DIR",
                f"{path} is a pipeline's dir (its {', '.join(staged)} are stages), written before blocks "
                f"recorded its stages ({PIPELINE_FILE})",
                f"run the pipeline again (it skips its finished stages and records them), or report one stage: "
                f"blocks report {jobs[0]}",
            )
        )
    return _sweep_report(path, [read_run(p) for p in jobs], pipelines, objective=objective, mode=mode)


def _sweep_jobs(root: Path) -> tuple[list[Path], list[Path]]:
    """The job dirs of the sweep dir *root*, in job order: its run dirs at any depth, none inside another; and the pipelines' dirs found.

    A ``hydra.sweep.subdir`` of several levels (``lr/${optim.lr}``) puts them deeper than one
    level below the sweep dir. A run dir's own subdirs (checkpoints, ``.hydra``) are not
    searched; a link to a dir is not followed (a link to a run dir is a job). Dot-dirs
    (``.hydra`` of a job killed before it wrote its run files) are not searched. A job is a dir
    with the files blocks alone writes (:func:`_written_run_dir`), at any depth: a config dir
    beside the runs (``conf/config.yaml``) is no job. A pipeline's dir (its ``pipeline.json``)
    is not searched either: its stages are no sweep's jobs, and it is listed apart (its own
    report is ``blocks report`` of that dir).
    """
    jobs, pipelines = [], []
    for top, dirs, _ in os.walk(root):
        for name in list(dirs):
            path = Path(top, name)
            if name.startswith("."):
                dirs.remove(name)
            elif (path / PIPELINE_FILE).is_file():
                pipelines.append(path)
                dirs.remove(name)
            elif _written_run_dir(path):
                jobs.append(path)
                dirs.remove(name)

    def order(found: Path) -> tuple[tuple[int, int, str], ...]:
        return _job_order(found.relative_to(root))

    return sorted(jobs, key=order), sorted(pipelines, key=order)


def _job_name(root: Path, job: Path) -> str:
    """How a report names the job dir *job* of the sweep dir *root*: its path below *root* (``3``, ``lr/0.01``)."""
    return job.relative_to(root).as_posix()


def _job_order(relative: Path) -> tuple[tuple[int, int, str], ...]:
    """Numbered job dirs by number, before the others by name, at each level."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in relative.parts)


# --- one run ------------------------------------------------------------------------------------


def _report_dir(root: Path) -> Path:
    """``root/report``, made if missing; refused when it is a link (the report is written inside *root* only)."""
    out = root / REPORT_DIR
    if out.is_symlink():
        raise BlocksError(
            Problem(
                "RUN_DIR",
                f"{out} is a link (to {out.readlink()}): a report is written only inside the directory it reports on",
                f"remove the link (rm {out}) and run blocks report again",
            )
        )
    out.mkdir(exist_ok=True)
    return out


def _unlinked(path: Path) -> Path:
    """*path*, with a link found there removed first: a file of the report replaces it, never its target."""
    if path.is_symlink():
        path.unlink()
    return path


def _run_report(run: RunData) -> Path:
    out = _report_dir(run.path)
    plots: list[tuple[str, Path]] = []
    for name, (title, wanted) in RUN_PLOTS.items():
        series = {metric: run.columns[metric] for metric in wanted if run.columns.get(metric)}
        if series:
            plots.append((title, _line_plot(out / f"{name}.png", title, series)))
    others = sorted(n for n in run.columns if n.startswith("val/") and n != "val/loss")
    if others:
        series = {n: run.columns[n] for n in others}
        plots.append(("Validation metrics", _line_plot(out / "validation.png", "Validation metrics", series)))
    table = _run_table(run)
    title = f"Run report: {run.path.resolve().name}"
    _write_documents(out, title, [("Summary", ["", ""], table)], plots)
    return out


def _run_table(run: RunData) -> list[list[str]]:
    summary = run.summary
    rows = [["status", run.status]]
    if summary.get("reason"):
        rows.append(["reason", str(summary["reason"])])
    for key in ("global_step", "epoch", "world_size", "restarts", "resumed_from"):
        if summary.get(key) not in (None, ""):
            rows.append([key, str(summary[key])])
    if summary.get("wall_s"):
        rows.append(["wall time (this attempt)", f"{summary['wall_s']:.1f} s"])
    if summary.get("train_s"):
        rows.append(["training time (whole run)", f"{summary['train_s']:.1f} s"])
    rows += [[label, _fmt(value)] for label, value in run_throughputs(summary)]
    for name in _shown_metrics(run):
        value = run.final(name, steady_throughput=False)
        if value is not None:
            rows.append([metric_label(name), _fmt(value)])
    return rows


def _shown_metrics(run: RunData) -> list[str]:
    """The metrics a run's table shows: the training loss, every ``val/`` and ``test/`` metric, the last window's throughput, health counters."""
    names = set(run.summary.get("metrics", {})) | set(run.columns)
    scores = sorted(n for n in names if n.startswith(("val/", "test/")))
    health = sorted(n for n in names if n.startswith("health/"))
    return ["train/loss", *scores, *LAST_WINDOW_SHOWN, *health]


# --- a pipeline ---------------------------------------------------------------------------------


def _pipeline_report(root: Path, stages: list[dict[str, Any]]) -> Path:
    """A table of the pipeline's stages in order (what each does, its status, step and metrics) and the train stages' loss curves."""
    rows = []
    curves: dict[str, list[tuple[int, float]]] = {}
    runs: dict[str, RunData | None] = {}
    outdated: set[str] = set()
    for stage in stages:
        name, stage_dir, upstream = stage["name"], root / stage["name"], stage.get("from")
        run = runs[name] = read_run(stage_dir) if stage_dir.is_dir() else None
        does = stage["does"] + (
            f" ({'from' if stage['does'] == 'train' else 'of'} {upstream})" if upstream else ""
        )
        status = "not started" if run is None else run.status
        why = (
            None if run is None or not upstream else _outdated(stage_dir, upstream, runs[upstream], outdated)
        )
        if why:
            outdated.add(name)
            status = f"outdated ({why})" if status == "completed" else f"{status}, outdated ({why})"
        shown = "" if run is None else _stage_metrics(stage_dir, run)
        if why and shown:
            shown += f" (of an earlier result of {upstream})"
        step = str(run.summary.get("global_step", "")) if run is not None and stage["does"] == "train" else ""
        rows.append([name, does, status, step, shown, str(stage_dir)])
        if run is not None and run.columns.get("train/loss"):
            curves[name] = run.columns["train/loss"]
    out = _report_dir(root)
    plots: list[tuple[str, Path]] = []
    if curves:
        plots.append(
            ("Training loss of every train stage", _line_plot(out / "train_loss.png", "train/loss", curves))
        )
    header = ["stage", "does", "status", "step", "metrics", "dir"]
    _write_documents(
        out,
        f"Pipeline report: {root.resolve().name} ({len(stages)} stages)",
        [("Stages in order", header, rows)],
        plots,
    )
    return out


def _outdated(stage_dir: Path, upstream: str, source: RunData | None, outdated: set[str]) -> str | None:
    """Why the result in *stage_dir* is no longer about its upstream's current result (None: it still is).

    The same test a pipeline rerun makes before it skips the stage (:func:`upstream_changes`).
    """
    if upstream in outdated:
        return f"{upstream} is outdated"
    if source is None or not source.summary:
        return f"{upstream} has no result"
    if not (stage_dir / UPSTREAM_FILE).is_file():
        return f"which result of {upstream} it took is not recorded"
    return (
        f"{upstream} ran again"
        if upstream_changes(stage_dir, upstream_result(upstream, source.summary))
        else None
    )


def _stage_metrics(stage_dir: Path, run: RunData) -> str:
    """A stage's ``val/`` and ``test/`` metrics: an evaluation's ``metrics.json``, else its ``summary.json``'s."""
    metrics: Any = run.summary.get("metrics") or {}
    if (stage_dir / "metrics.json").is_file():  # an evaluation's scores
        try:
            metrics = json.loads((stage_dir / "metrics.json").read_text())
        except (OSError, ValueError) as exc:
            return f"unreadable: {stage_dir / 'metrics.json'} ({exc})"
    if not isinstance(metrics, dict) or not all(isinstance(v, (int, float)) for v in metrics.values()):
        return f"unreadable: the metrics of {stage_dir} are not numbers by name"
    return ", ".join(
        f"{k}={_fmt(float(v))}" for k, v in metrics.items() if str(k).startswith(("val/", "test/"))
    )


# --- a sweep ------------------------------------------------------------------------------------


def _sweep_report(
    root: Path, runs: list[RunData], pipelines: list[Path], *, objective: str | None, mode: str | None
) -> Path:
    monitor: dict[str, Any] = next((r.config.get("monitor", {}) for r in runs if r.config), {})
    explicit = objective is not None
    objective = objective or str(monitor.get("objective", "val/loss"))
    mode = mode or str(monitor.get("objective_mode", "min"))
    params = swept_parameters(runs)
    # Without --objective, a job lacking the metric is scored as the driver scored it for the sweeper
    # (train/loss, when minimized). Only a completed job is scored: another one's last logged value is
    # of a step it did not finish from.
    fallback = not explicit and mode != "max"
    scored = [
        (run, _objective(run, objective, fallback=fallback) if run.status == "completed" else None)
        for run in runs
    ]
    ranked = sorted(scored, key=lambda item: _rank_key(item[1], mode))
    header = ["rank", "job", "status", *params, objective]
    table = []
    for position, (run, value) in enumerate(ranked, start=1):
        values = _override_values(run)
        table.append(
            [
                str(position) if _usable(value) else "-",
                _job_name(root, run.path),
                run.status,
                *[values.get(p, "") for p in params],
                _fmt(value) if value is not None else "-",
            ]
        )
    out = _report_dir(root)
    plots: list[tuple[str, Path]] = []
    for param in params:
        points = [(_override_values(run).get(param, ""), value) for run, value in scored if _usable(value)]
        if points:
            safe = param.replace("/", "_").replace(".", "_")
            title = f"{objective} against {param}"
            plots.append(
                (title, _objective_plot(out / f"objective_vs_{safe}.png", title, param, objective, points))
            )
    curves = {
        _job_name(root, run.path): run.columns["train/loss"] for run in runs if run.columns.get("train/loss")
    }
    if curves:
        plots.append(("Training loss of every job", _line_plot(out / "train_loss.png", "train/loss", curves)))
    # root.resolve(): the name of `blocks report .` is empty.
    title = f"Sweep report: {root.resolve().name} ({len(runs)} jobs, {objective}, {mode})"
    tables: list[Table] = [(f"Jobs ranked by {objective} ({mode})", header, table)]
    if pipelines:
        tables.append(
            (
                "Pipelines left out (each has its own report)",
                ["pipeline", "its report"],
                [[_job_name(root, p), f"blocks report {p}"] for p in pipelines],
            )
        )
    _write_documents(out, title, tables, plots)
    return out


def _objective(run: RunData, name: str, *, fallback: bool) -> float | None:
    value = run.final(name)
    return run.final("train/loss") if value is None and fallback else value


def swept_parameters(runs: Sequence[RunData]) -> list[str]:
    """The override keys whose values differ between the jobs, in command-line order."""
    keys: list[str] = []
    values: dict[str, set[str]] = {}
    for run in runs:
        for key, value in _override_values(run).items():
            if key not in values:
                keys.append(key)
                values[key] = set()
            values[key].add(value)
    return [k for k in keys if len(values[k]) > 1 or any(k not in _override_values(r) for r in runs)]


def _override_values(run: RunData) -> dict[str, str]:
    out = {}
    for override in run.overrides:
        key, _, value = override.partition("=")
        out[key.lstrip("+~")] = value
    return out


def _usable(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _rank_key(value: float | None, mode: str) -> tuple[int, float]:
    if not _usable(value):
        return (1, 0.0)
    assert value is not None
    return (0, value if mode == "min" else -value)


# --- plots and documents --------------------------------------------------------------------------


def _figure() -> tuple[Any, Any]:
    try:
        import matplotlib
    except ImportError:
        raise BlocksError(
            Problem(
                "report",
                "blocks report needs matplotlib, which is not installed",
                "pip install 'blocks[monitor]'",
            )
        ) from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt.subplots(figsize=FIGSIZE, dpi=DPI)


def _save(fig: Any, path: Path) -> Path:
    from matplotlib import pyplot as plt

    fig.tight_layout()
    fig.savefig(_unlinked(path), dpi=DPI)
    plt.close(fig)
    return path


def _line_plot(path: Path, title: str, series: dict[str, list[tuple[int, float]]]) -> Path:
    fig, ax = _figure()
    for label, points in series.items():
        steps = [s for s, _ in points]
        values = [v for _, v in points]
        ax.plot(steps, values, marker="o" if len(points) < 20 else None, markersize=3, label=label)
    positive = all(v > 0 for points in series.values() for _, v in points if math.isfinite(v))
    spread = [v for points in series.values() for _, v in points if math.isfinite(v) and v > 0]
    if positive and spread and max(spread) / min(spread) > 1e3:
        ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize="small")
    return _save(fig, path)


def _objective_plot(
    path: Path, title: str, param: str, objective: str, points: list[tuple[str, float | None]]
) -> Path:
    fig, ax = _figure()
    numeric = all(_is_number(x) for x, _ in points)
    ys = [float(y) for _, y in points if y is not None]
    if numeric:
        xs = [float(x) for x, _ in points]
        ax.scatter(xs, ys)
        if min(xs) > 0 and max(xs) / min(xs) > 10:
            ax.set_xscale("log")
    else:
        labels = sorted({x for x, _ in points})
        ax.scatter([labels.index(x) for x, _ in points], ys)
        ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel(param)
    ax.set_ylabel(objective)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}"


Table = tuple[str, list[str], list[list[str]]]


def _write_documents(out: Path, title: str, tables: list[Table], plots: list[tuple[str, Path]]) -> None:
    """``report.md`` (plots linked) and ``report.html`` (plots embedded)."""
    md = [f"# {title}", ""]
    page = [f"<h1>{html.escape(title)}</h1>"]
    for caption, header, rows in tables:
        md += [f"## {caption}", "", *_markdown_table(header, rows), ""]
        page.append(f"<h2>{html.escape(caption)}</h2>")
        page.append(_html_table(header, rows))
    if plots:
        md += ["## Plots", ""]
        page.append("<h2>Plots</h2>")
    for caption, path in plots:
        md += [f"### {caption}", "", f"![{caption}]({path.name})", ""]
        data = base64.b64encode(path.read_bytes()).decode()
        page.append(
            f'<h3>{html.escape(caption)}</h3><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
        )
    _unlinked(out / "report.md").write_text("\n".join(md))
    style = "body{font-family:sans-serif;max-width:900px;margin:auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}"
    _unlinked(out / "report.html").write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>\n" + "\n".join(page) + "\n</body></html>\n"
    )


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
