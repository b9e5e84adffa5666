"""The metrics callback: cheap accumulation on the device, one host sync per logging interval."""

from __future__ import annotations

import time
from typing import Any

import pytorch_lightning as pl
import torch

from blocks.monitor.sinks import MetricSink, Row


class MetricsRecorder(pl.Callback):
    """Collects training metrics every ``log_every_n_steps`` optimizer steps and validation metrics.

    Between rows, the loss of each micro-batch is added to a device tensor (no host sync);
    at a logging step the row is read back once: ``train/loss`` (mean over the steps since
    the last row), ``lr``, ``grad_norm`` (before clipping), ``samples_per_s`` and
    ``step_time_s``. Only global rank 0 writes to the sinks.
    """

    def __init__(self, sinks: list[MetricSink], *, every_n_steps: int, global_batch: int, grad_norm: bool) -> None:
        self.sinks = sinks
        self.every = every_n_steps
        self.global_batch = global_batch
        self.want_grad_norm = grad_norm
        self.last: Row = {}
        self._loss_sum: torch.Tensor | None = None
        self._steps = 0
        self._seen_step = 0
        self._window_start = 0.0
        self._train_start = 0.0
        self._grad_norm: torch.Tensor | None = None
        self.train_seconds = 0.0
        self.samples_seen = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start the clocks."""
        self._seen_step = trainer.global_step
        self._train_start = self._window_start = time.perf_counter()

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        """Measure the gradient norm before clipping, only on steps that will be logged."""
        if self.want_grad_norm and (trainer.global_step + 1) % self.every == 0:
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            if grads:
                self._grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Add the micro-batch loss (already divided by the accumulation count) and log on interval."""
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._loss_sum = loss.detach() if self._loss_sum is None else self._loss_sum + loss.detach()
        if trainer.global_step == self._seen_step:
            return
        self._steps += trainer.global_step - self._seen_step
        self._seen_step = trainer.global_step
        if trainer.global_step % self.every == 0:
            self._flush(trainer)

    def _flush(self, trainer: pl.Trainer) -> None:
        if not self._steps:
            return
        now = time.perf_counter()
        elapsed = max(now - self._window_start, 1e-9)
        row: Row = {}
        if self._loss_sum is not None:
            row["train/loss"] = float(self._loss_sum) / self._steps
        row["lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
        if self._grad_norm is not None:
            row["grad_norm"] = float(self._grad_norm)
        row["samples_per_s"] = self._steps * self.global_batch / elapsed
        row["step_time_s"] = elapsed / self._steps
        self.samples_seen += self._steps * self.global_batch
        self._emit(trainer, row)
        self._loss_sum, self._grad_norm, self._steps = None, None, 0
        self._window_start = now

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Record the validation metrics at the current step."""
        if trainer.sanity_checking:
            return
        values = getattr(pl_module, "val_metrics", {})
        if values:
            self._emit(trainer, dict(values))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Log the last partial window and stop the training clock."""
        self._flush(trainer)
        self.train_seconds = time.perf_counter() - self._train_start

    def _emit(self, trainer: pl.Trainer, row: Row) -> None:
        self.last.update(row)
        if trainer.is_global_zero:
            for sink in self.sinks:
                sink.write(trainer.global_step, row)

    def close(self) -> None:
        """Flush every sink."""
        for sink in self.sinks:
            sink.close()

    @property
    def samples_per_s(self) -> float:
        """Average training throughput over the whole run."""
        return self.samples_seen / self.train_seconds if self.train_seconds else 0.0
