"""The Lightning loggers of ``monitor.loggers``: started before training, given the config, continued on resume.

Each logger is a real ``pytorch_lightning.loggers`` object, handed to the Trainer (so Lightning
callbacks such as ``LearningRateMonitor`` find it) and fed blocks' metric rows by the metrics
callback. ``metrics.csv`` is not one of them: its columns (``step``, then one per metric in
order of first appearance, a training and a validation row of the same step merged) are part
of the run-dir contract, which Lightning's ``CSVLogger`` (sorted columns, one row per call)
does not keep, so :class:`blocks.monitor.sinks.CsvSink` still writes it.

Every logger is built and started (``logger.experiment``) before the first step, so a bad
argument, a tracking URI that does not work or a missing package is an error before training.
A new logger run gets the resolved config (flattened) and the plan's derived numbers as
hyperparameters. ``<run dir>/loggers.json`` keeps each logger's run id and the last step it
received; a resumed run (same run dir) continues the same logger run, and no step appears
twice or goes missing: TensorBoard purges the events after the checkpoint's step,
a ``CSVLogger`` keeps its rows up to it (Lightning's would delete the file), and any other
logger (MLflow, W&B, ...), which cannot delete what it has, skips the replayed steps it already has.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytorch_lightning.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from blocks.monitor.base import BUILTIN_LOGGERS, LOGGER_CLASS, MonitorBlock
from blocks.monitor.sinks import Row
from blocks.spec.errors import BlocksError, Problem
from blocks.spec.imports import TARGET_KEY, instantiate, resolve

log = logging.getLogger(__name__)

STATE_FILE = "loggers.json"
TENSORBOARD_DIR = "tensorboard"

RUN_ID_ARGUMENT = {
    "WandbLogger": "id",
    "MLFlowLogger": "run_id",
    "CometLogger": "experiment_key",
    "NeptuneLogger": "with_id",
}
"""The constructor argument that continues an existing logger run, by class name (``version`` otherwise)."""


@dataclass
class LoggerState:
    """``<run dir>/loggers.json``: per logger, its class, run id and the last step it received (global rank 0)."""

    path: Path
    loggers: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: Path) -> LoggerState:
        """The run dir's state; empty when there is none (or it cannot be read)."""
        path = run_dir / STATE_FILE
        try:
            return cls(path, json.loads(path.read_text()).get("loggers", {}))
        except (OSError, ValueError, AttributeError):
            return cls(path)

    def save(self) -> None:
        """Write the file atomically (a reader never sees half of it)."""
        if getattr(rank_zero_only, "rank", 0) != 0:
            return
        # Loggers start before anything else writes to the run dir.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"loggers": self.loggers}, indent=2) + "\n")
        os.replace(tmp, self.path)


class LoggerSink:
    """Hands metric rows to one Lightning logger, skipping the steps an earlier attempt already gave it."""

    def __init__(self, key: str, logger: Logger, state: LoggerState, *, replayed_until: int | None) -> None:
        self.key = key
        self.logger = logger
        self.state = state
        self.replayed_until = replayed_until
        self._had_at_last_step = set(state.loggers.get(key, {}).get("names", ())) if replayed_until else set()

    def write(self, step: int, row: Row) -> None:
        """Log *row* at *step*, but not what the logger run already has (replayed steps); record the step."""
        if self.replayed_until is not None:
            if step < self.replayed_until:
                return
            if step == self.replayed_until:  # a kill between the training and the validation row of a step
                row = {name: value for name, value in row.items() if name not in self._had_at_last_step}
                if not row:
                    return
        self.logger.log_metrics(dict(row), step=step)
        entry = self.state.loggers[self.key]
        names = entry.get("names", []) if entry.get("step") == step else []
        entry.update(step=step, names=[*names, *row])
        self.state.save()

    def flush(self) -> None:
        """Ask the logger to write what it buffered."""
        self.logger.save()

    def close(self) -> None:
        """Write out what the logger buffered; :func:`finalize_loggers` ends its run once the run's status is known."""
        self.logger.save()

    def finalize(self, run_status: str) -> None:
        """End the logger's run as *run_status* (``summary.json``'s: completed, failed or interrupted) ended."""
        self.logger.finalize(lightning_status(run_status, self.logger))


def lightning_status(run_status: str, logger: Logger) -> str:
    """The status ``Logger.finalize`` takes for a run that ended *run_status*.

    Lightning's statuses are ``success`` and ``failed``; an interrupted run is ``KILLED`` for
    MLflow (whose ``finalize`` passes a status it does not know on to the tracking store), a
    failed run for any other logger.
    """
    if run_status == "completed":
        return "success"
    if run_status == "interrupted" and isinstance(logger, MLFlowLogger):
        return "KILLED"
    return "failed"


def finalize_loggers(sinks: list[LoggerSink], run_status: str) -> None:
    """End every logger's run as the run ended; one that fails is logged and leaves the others to end."""
    for sink in sinks:
        try:
            sink.finalize(run_status)
        except Exception:
            log.exception("could not finalize %s", sink.key)


def build_loggers(
    monitor: MonitorBlock, run_dir: Path, *, resumed_step: int | None, hyperparameters: dict[str, Any]
) -> list[LoggerSink]:
    """One started logger per ``monitor.loggers`` entry but ``csv`` (``metrics.csv``, written always)."""
    state = LoggerState.load(run_dir) if resumed_step is not None else LoggerState(run_dir / STATE_FILE)
    sinks = []
    for i, entry in enumerate(monitor.loggers):
        if entry == "csv":
            continue
        if isinstance(entry, Mapping):
            name, args = str(entry[TARGET_KEY]), {k: v for k, v in entry.items() if k != TARGET_KEY}
            args = instantiate(args, f"monitor.loggers[{i}]")
        else:
            name, args = str(entry), dict(monitor.logger_args)
        key = f"{i}:{name}"
        saved = state.loggers.get(key) if resumed_step is not None else None
        sink = _start(name, key, args, run_dir, resumed_step, saved, state)
        if saved is None or isinstance(sink.logger, CSVLogger):  # a CSVLogger rewrites hparams.yaml
            sink.logger.log_hyperparams(hyperparameters)
        sink.logger.save()
        state.loggers[key] = {
            "class": name,
            "run_id": _run_id(sink.logger),
            "step": saved.get("step") if saved else None,
            "names": saved.get("names", []) if saved else [],
        }
        sinks.append(sink)
    state.save()
    return sinks


def _start(
    name: str,
    key: str,
    args: dict[str, Any],
    run_dir: Path,
    resumed_step: int | None,
    saved: dict[str, Any] | None,
    state: LoggerState,
) -> LoggerSink:
    if name == "tensorboard":
        cls: type[Logger] = TensorBoardLogger
        # A resumed run purges the events after its checkpoint's step, a fresh start (metrics.csv
        # starts over too) every earlier run's events in the run dir: TensorBoard shows one run.
        args = {"save_dir": str(run_dir), "name": TENSORBOARD_DIR, "version": ""}
        args["purge_step"] = 0 if resumed_step is None else resumed_step + 1
    else:
        assert name not in BUILTIN_LOGGERS
        cls = resolve(name, "monitor.loggers", kind=LOGGER_CLASS)  # checked before start too (refuse_objects)
        if saved is not None and saved.get("run_id") is not None:
            args[RUN_ID_ARGUMENT.get(cls.__name__, "version")] = saved["run_id"]
    try:
        logger = cls(**args)
    except Exception as exc:
        raise BlocksError(
            Problem(
                "monitor.logger_args",
                f"{name} could not be built: {type(exc).__name__}: {exc}",
                _fix(exc, f"give monitor.logger_args the arguments {cls.__name__} takes"),
                check="logger-start",
            )
        ) from None
    kept = _csv_rows_until(logger, resumed_step) if isinstance(logger, CSVLogger) and saved else []
    try:
        _ = logger.experiment  # type: ignore[attr-defined]  # start it now: a bad URI or a missing package stops the run before step 1
    except Exception as exc:
        raise BlocksError(
            Problem(
                "monitor.loggers",
                f"{name} could not start: {type(exc).__name__}: {exc}",
                _fix(exc, "correct monitor.logger_args (e.g. tracking_uri=sqlite:///mlflow.db for MLflow)"),
                check="logger-start",
            )
        ) from None
    for (
        step,
        row,
    ) in kept:  # Lightning's CSVLogger deleted its file on start: put back what the checkpoint covers
        logger.log_metrics(row, step=step)
    if name == "tensorboard" or isinstance(logger, CSVLogger):
        replayed_until = None  # they drop the replayed steps themselves (purge_step, the kept rows)
    else:
        replayed_until = saved.get("step") if saved else None
    return LoggerSink(key, logger, state, replayed_until=replayed_until)


def _fix(exc: Exception, otherwise: str) -> str:
    if isinstance(exc, ImportError):
        missing = getattr(exc, "name", None) or "the logger's package"
        return f"pip install {missing} (or pip install 'blocks[monitor]')"
    return otherwise


def _run_id(logger: Logger) -> int | str | None:
    """The logger's run id (MLflow's run id, W&B's id, a CSV/TensorBoard version)."""
    run_id = getattr(logger, "run_id", None)
    version = run_id if isinstance(run_id, str) else logger.version
    return version if isinstance(version, (int, str)) else None


def _csv_rows_until(logger: CSVLogger, step: int | None) -> list[tuple[int, dict[str, float]]]:
    """The rows of the CSVLogger's ``metrics.csv`` up to *step* (all of them when None)."""
    path = Path(logger.log_dir) / "metrics.csv"
    if not path.is_file():
        return []
    kept = []
    with path.open(newline="") as fh:
        for record in csv.DictReader(fh):
            at = int(float(record["step"]))
            if step is None or at <= step:
                kept.append((at, {k: float(v) for k, v in record.items() if k != "step" and v}))
    return kept


def hyperparameters(config: dict[str, Any], derived: dict[str, Any]) -> dict[str, Any]:
    """The resolved config flattened to dotted keys, and the derived numbers under ``derived.``.

    Values stay numbers, strings and booleans; a list or null becomes its JSON text (every logger takes those).
    """
    flat: dict[str, Any] = {}

    def walk(value: Any, prefix: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        elif isinstance(value, (bool, int, float, str)):
            flat[prefix] = value
        else:
            flat[prefix] = json.dumps(value, default=str)

    walk(config, "")
    walk({"derived": derived}, "")
    return flat
