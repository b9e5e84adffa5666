"""Keeping logger run ids in checkpoints, so a resumed run continues the same logger run."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from blocks.monitor.loggers import LightningLoggerSink


class LoggerRunState(pl.Callback):
    """Saves each Lightning logger's run id with the checkpoint and hands it back on resume.

    Lightning restores callback states before the first training step, and the loggers are
    built on their first row, so a resumed run's logger is created with the saved id.
    """

    def __init__(self, sinks: list[LightningLoggerSink]) -> None:
        self.sinks = sinks

    def state_dict(self) -> dict[str, Any]:
        """``{"run_ids": [...]}``, one per logger (global rank 0's: only it builds loggers)."""
        return {"run_ids": [sink.run_id for sink in self.sinks]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Remember the saved ids for the loggers' first row."""
        for sink, run_id in zip(self.sinks, state_dict.get("run_ids", []), strict=False):
            if run_id is not None and sink.logger is None:
                sink.resume_id = run_id
