"""Loggers beyond ``metrics.csv``: TensorBoard event files and an adapter for any Lightning logger.

Both are metric sinks (:class:`blocks.monitor.sinks.MetricSink`): global rank 0 hands them
the same rows as ``metrics.csv``. They import their libraries only when a run uses them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from blocks.monitor.base import LOGGER_CLASS
from blocks.monitor.sinks import Row
from blocks.spec.errors import BlocksError, Problem
from blocks.spec.imports import resolve

log = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"

RUN_ID_ARGUMENT = {
    "WandbLogger": "id",
    "MLFlowLogger": "run_id",
    "CometLogger": "experiment_key",
    "NeptuneLogger": "with_id",
}
"""The constructor argument that continues an existing logger run, by class name (``version`` otherwise)."""


class TensorBoardSink:
    """Scalars in ``<run dir>/tensorboard`` (``torch.utils.tensorboard``), one tag per metric.

    A resumed run writes into the same directory and purges the events after its checkpoint's
    step, so TensorBoard shows one continuous run.
    """

    def __init__(self, run_dir: Path, *, resumed_step: int | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise BlocksError(
                Problem(
                    "monitor.loggers",
                    "the tensorboard logger needs the tensorboard package, which is not installed",
                    "pip install 'blocks[monitor]' (or pip install tensorboard)",
                )
            ) from None
        purge = resumed_step + 1 if resumed_step is not None else None
        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=purge)

    def write(self, step: int, row: Row) -> None:
        """One scalar per metric at *step*."""
        for name, value in row.items():
            self.writer.add_scalar(name, value, global_step=step)

    def flush(self) -> None:
        """Write the pending events."""
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


class LightningLoggerSink:
    """Hands rows to any Lightning logger (W&B, MLflow, Comet, Neptune, CSV...), built on the first row.

    The logger's run id (``logger.version``) is kept in every checkpoint (see
    :class:`LoggerRunState`); a resumed run passes it back to the logger class, so the logger
    continues the same run instead of starting a new one.
    """

    def __init__(self, class_path: str, args: dict[str, Any]) -> None:
        # The import seam checks the path (allowed, never a denied module) and that it is a Lightning logger class.
        self.cls = resolve(class_path, "monitor.loggers", kind=LOGGER_CLASS)
        self.args = dict(args)
        self.logger: Any = None
        self.resume_id: int | str | None = None

    @property
    def run_id(self) -> int | str | None:
        """The logger's run id (``version``, as the logger gives it) once it is built; before, the one to resume."""
        if self.logger is None:
            return self.resume_id
        version = self.logger.version
        return version if isinstance(version, (int, str)) else None

    def _build(self) -> Any:
        if self.logger is None:
            args = dict(self.args)
            if self.resume_id is not None:
                args[RUN_ID_ARGUMENT.get(self.cls.__name__, "version")] = self.resume_id
            self.logger = self.cls(**args)
        return self.logger

    def write(self, step: int, row: Row) -> None:
        """Log the row at *step*."""
        self._build().log_metrics(dict(row), step=step)

    def flush(self) -> None:
        """Ask the logger to write what it buffered."""
        if self.logger is not None:
            self.logger.save()

    def close(self) -> None:
        """Finalize the logger's run."""
        if self.logger is not None:
            self.logger.finalize("success")
