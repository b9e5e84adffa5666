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
received; a resumed run (same run dir) continues the same logger run. The steps after the
checkpoint that a killed attempt had logged are redone, and logged again: TensorBoard purges
its events from the checkpoint's step on (Lightning numbers the step after it so) and gets
that step's row back from the checkpoint, a ``CSVLogger`` keeps its rows before that step
(Lightning's would delete the file) and gets it back too; a logger that cannot delete what it
has (MLflow, W&B, ...) holds both attempts' values of those steps, the resumed run's newest,
which is what ``metrics.csv`` holds (skipping them kept the dead attempt's, wrong after a
changed setting). A resume that changed hyperparameters or logged steps again notes it under
``resume.<n>.`` (MLflow refuses to change a param); a logger run ends with the run's status.
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

from blocks.compat.torch_private import tensorboard_hparams
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
    """``<run dir>/loggers.json``: each logger's run id, last step and resume count; the hyperparameters logged last.

    Per logger: its class, run id, the last step it received and how many resumes it noted
    (``resume.<n>.*``). Written by global rank 0.
    """

    path: Path
    loggers: dict[str, dict[str, Any]] = field(default_factory=dict)
    hyperparameters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: Path) -> LoggerState:
        """The run dir's state; empty when there is none (or it cannot be read)."""
        path = run_dir / STATE_FILE
        try:
            data = json.loads(path.read_text())
            return cls(path, data.get("loggers", {}), data.get("hyperparameters", {}))
        except (OSError, ValueError, AttributeError):
            return cls(path)

    def save(self) -> None:
        """Write the file atomically (a reader never sees half of it)."""
        if getattr(rank_zero_only, "rank", 0) != 0:
            return
        # Loggers start before anything else writes to the run dir.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        content = {"loggers": self.loggers, "hyperparameters": self.hyperparameters}
        tmp.write_text(json.dumps(content, indent=2) + "\n")
        os.replace(tmp, self.path)


class LoggerSink:
    """Hands metric rows to one Lightning logger and records the last step it received."""

    def __init__(self, key: str, logger: Logger, state: LoggerState) -> None:
        self.key = key
        self.logger = logger
        self.state = state

    def write(self, step: int, row: Row) -> None:
        """Log *row* at *step* (a step a resumed run redoes too: see the module's docstring); record the step."""
        self.logger.log_metrics(dict(row), step=step)
        self.state.loggers[self.key]["step"] = step
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
    monitor: MonitorBlock,
    run_dir: Path,
    *,
    resumed_step: int | None,
    hyperparameters: dict[str, Any],
    resumed_row: Row | None = None,
) -> list[LoggerSink]:
    """One started logger per ``monitor.loggers`` entry but ``csv`` (``metrics.csv``, written always).

    *resumed_row*: what blocks logged at *resumed_step* (the checkpoint's metrics, and what
    ``metrics.csv`` holds of that step beyond them: the validation an older blocks made after a
    run's final checkpoint); a TensorBoard or CSV logger that continues its run gets it again (it dropped
    it with the steps the resumed run redoes).
    """
    state = LoggerState.load(run_dir) if resumed_step is not None else LoggerState(run_dir / STATE_FILE)
    changed = _changed(state.hyperparameters, hyperparameters)
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
        logger = _start(name, args, run_dir, resumed_step, saved)
        state.loggers[key] = {"class": name, "run_id": _run_id(logger), **_kept(saved)}
        rewritable = _drops_redone_steps(logger)
        notes = {}
        if saved is not None and resumed_step is not None:
            notes = _resume_notes(state.loggers[key], resumed_step, changed, relogs=not rewritable)
            if rewritable and resumed_row:
                logger.log_metrics(dict(resumed_row), step=resumed_step)
        if saved is None or rewritable:  # TensorBoard and a CSVLogger rewrite their hparams.yaml
            _log_hyperparams(logger, {**hyperparameters, **state.loggers[key]["notes"]}, new=saved is None)
        elif notes:  # MLflow refuses to change a param: what changed goes under resume.<n>.
            logger.log_hyperparams(notes)
        logger.save()
        sinks.append(LoggerSink(key, logger, state))
    state.hyperparameters = hyperparameters
    state.save()
    return sinks


def _log_hyperparams(logger: Logger, params: dict[str, Any], *, new: bool) -> None:
    """Give *logger* all hyperparameters; a *new* TensorBoard run also gets them for its HParams tab.

    TensorBoard shows the HParams of a run's first start only (later ones are ignored); its
    ``hparams.yaml``, which its ``save`` never overwrites, is written again with *params*.
    """
    # On the other ranks a TensorBoard logger writes nothing (no file writer to give the summary to).
    if isinstance(logger, TensorBoardLogger) and getattr(rank_zero_only, "rank", 0) == 0:
        (Path(logger.log_dir) / logger.NAME_HPARAMS_FILE).unlink(missing_ok=True)
        if new:  # the training loss beside them, not Lightning's placeholder hp_metric (see _start)
            tensorboard_hparams(logger.experiment, params, ["train/loss"])
    logger.log_hyperparams(params)


def _kept(saved: dict[str, Any] | None) -> dict[str, Any]:
    """What a continued logger's entry keeps: the last step it received, its resumes and what they noted."""
    if saved is None:
        return {"step": None, "notes": {}}
    return {"step": saved.get("step"), "resumes": saved.get("resumes", 0), "notes": saved.get("notes", {})}


def _drops_redone_steps(logger: Logger) -> bool:
    """Whether the logger drops, on resume, what it has from the checkpoint's step on (TensorBoard, a CSVLogger)."""
    return isinstance(logger, (TensorBoardLogger, CSVLogger))


def _changed(before: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """The hyperparameters whose value differs from what the loggers got last (none when that is unknown)."""
    if not before:
        return {}
    return {key: value for key, value in now.items() if before.get(key, _MISSING) != value}


_MISSING = object()


def _resume_notes(
    entry: dict[str, Any], resumed_step: int, changed: dict[str, Any], *, relogs: bool
) -> dict[str, Any]:
    """The ``resume.<n>.*`` hyperparameters of a logger run's *n*-th resume that changed something, counted in *entry*.

    The changed hyperparameters, ``from_step`` (the checkpoint's step) and, for a logger that
    cannot drop what it has (*relogs*), ``relogged_steps``: the steps after the checkpoint an
    earlier attempt had logged, which this one logs again.
    """
    notes: dict[str, Any] = {}
    last = entry.get("step")
    if relogs and isinstance(last, int) and last > resumed_step:
        notes["relogged_steps"] = f"{resumed_step + 1}-{last}"
    notes.update(changed)
    if not notes:
        return {}
    entry["resumes"] = n = entry.get("resumes", 0) + 1
    noted = {f"resume.{n}.{name}": value for name, value in {"from_step": resumed_step, **notes}.items()}
    entry["notes"] = {**entry.get("notes", {}), **noted}
    return noted


def _start(
    name: str,
    args: dict[str, Any],
    run_dir: Path,
    resumed_step: int | None,
    saved: dict[str, Any] | None,
) -> Logger:
    if name == "tensorboard":
        cls: type[Logger] = TensorBoardLogger
        # A resumed run purges the events from its checkpoint's step on: Lightning's own (a
        # LearningRateMonitor's) of the step after it carry its number (Lightning counts the
        # steps done before one). A fresh start (metrics.csv starts over too) purges every
        # earlier run's events in the run dir: TensorBoard shows one run. No hp_metric: blocks
        # logs no placeholder metric.
        args = {"save_dir": str(run_dir), "name": TENSORBOARD_DIR, "version": "", "default_hp_metric": False}
        args["purge_step"] = 0 if resumed_step is None else resumed_step
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
    kept = _csv_rows_before(logger, resumed_step) if isinstance(logger, CSVLogger) and saved else []
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
    return logger


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


def _csv_rows_before(logger: CSVLogger, step: int | None) -> list[tuple[int, dict[str, float]]]:
    """The rows of the CSVLogger's ``metrics.csv`` before *step* (all of them when None)."""
    path = Path(logger.log_dir) / "metrics.csv"
    if not path.is_file():
        return []
    kept = []
    with path.open(newline="") as fh:
        for record in csv.DictReader(fh):
            at = int(float(record["step"]))
            if step is None or at < step:
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
