"""The LightningModule built from the model, task and optim blocks."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch

from blocks.compat.torch_private import DirectBatchTransfer, DirectHookNameWrites, compile_in_place
from blocks.data.base import BatchSpec, DataBlock
from blocks.model.base import ModelBlock
from blocks.optim.base import OptimBlock
from blocks.runtime.contract import BatchContract
from blocks.runtime.datamodule import VALID
from blocks.runtime.init import initialize
from blocks.task.base import TaskBlock

log = logging.getLogger(__name__)

VALIDATION_PREFIX = "val/"
"""What the names of validation metrics start with (``val/loss``, ``val/accuracy``...)."""


class BlocksModule(DirectBatchTransfer, DirectHookNameWrites, pl.LightningModule):
    """Trains ``model`` on ``task``'s loss with ``optim``; validation metrics come from the task.

    Training steps return the loss and log nothing: the metrics callback reads the loss from
    the step outputs and syncs with the device only at its logging interval. The first batch
    (training or validation) and the model's outputs for it are checked against the data's
    batch spec (:class:`~blocks.runtime.contract.BatchContract`), before any loss is computed.
    """

    def __init__(
        self,
        model: ModelBlock,
        task: TaskBlock,
        optim: OptimBlock,
        spec: BatchSpec,
        total_steps: int,
        parallelize: Callable[..., None] | None = None,
        compile_mode: str | None = None,
        data: DataBlock | None = None,
    ) -> None:
        super().__init__()
        self._batch_checked = False
        self.parallelize = parallelize
        self._parallelized = False
        self.compile_mode = compile_mode
        self.model = model.build(spec)
        initialize(self.model, model)
        self.objective = task.build(spec)
        self.contract = BatchContract.of_run(spec, data, model, self.objective)
        self.optim_block = optim
        self.total_steps = total_steps
        self.val_metrics: dict[str, float] = {}
        self._optim_settings: list[dict[str, Any]] = []
        self.validated_at_step = -1

    def configure_model(self) -> None:
        """Apply the strategy's parallelization (FSDP2) once, on the device mesh Lightning set up, compiling.

        A parallelization that takes a ``compile_mode`` compiles what it parallelizes (FSDP2: each
        unit's forward, before sharding it); otherwise the whole model is compiled after it. Both compile in place
        (:mod:`blocks.compat.torch_private`), so parameter names (checkpoints, weights) do not change.
        """
        if self._parallelized:
            return
        compiles = self.parallelize is not None and _compiles_what_it_parallelizes(self.parallelize)
        if self.parallelize is not None:
            options = {"compile_mode": self.compile_mode} if compiles else {}
            self.parallelize(self.model, self.device_mesh, **options)
        if self.compile_mode is not None and not compiles:
            compile_in_place(self.model, mode=self.compile_mode)
        self._parallelized = True

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The model's outputs for *inputs*."""
        return self.model(inputs)

    def model_outputs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model's outputs for *batch*; the first batch and its outputs are checked against the batch spec.

        The check reads shapes and dtypes only: it adds no device sync, and later batches skip it.
        """
        if self._batch_checked:
            return self.model(batch["inputs"])
        self.contract.check_batch(batch)
        outputs = self.model(batch["inputs"])
        self.contract.check_outputs(outputs, batch)
        self._batch_checked = True
        return outputs

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """The task's loss on one micro-batch."""
        return self.objective.loss(self.model_outputs(batch), batch)

    def on_validation_epoch_start(self) -> None:
        """Start validation metrics from zero, accumulating in float32 whatever the precision converted the module to."""
        self.objective.keep_metrics_float32()
        self.objective.reset()

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Accumulate the task's validation metrics over the batch's samples that are not padding.

        Every rank runs the forward on its whole batch (FSDP all-gathers in it); the samples the
        :data:`VALID` mask marks as padding are dropped before the metrics see them.
        """
        valid = batch.pop(VALID, None) if isinstance(batch, dict) else None
        outputs = self.model_outputs(batch)
        if valid is None:
            self.objective.update(outputs, batch)
        elif valid.any():
            self.objective.update(_samples(outputs, valid), _batch_samples(batch, valid))

    def on_validation_epoch_end(self) -> None:
        """Compute the metrics (synced across processes) and expose them as ``val/<name>``."""
        values = {f"{VALIDATION_PREFIX}{name}": value for name, value in self.objective.compute().items()}
        # sync_dist: already synced by the metrics, keeps Lightning quiet; logger=False: the metrics
        # callback hands the loggers these values (with the training row of the same step).
        self.log_dict(values, sync_dist=True, logger=False)
        self.val_metrics = {name: float(value) for name, value in values.items()}
        self.validated_at_step = self.trainer.global_step
        self.objective.reset()

    def on_train_start(self) -> None:
        """Apply the optim block's settings over those a resumed checkpoint restored (see :meth:`apply_optim_settings`)."""
        self.apply_optim_settings()

    def apply_optim_settings(self) -> None:
        """Put this run's optimizer settings and LR schedule back after a checkpoint's optimizer state was loaded.

        A resume (or a rollback) restores the saving run's LR, weight decay, betas... with the
        optimizer state; the changed ``optim`` settings apply from the first step trained after it.
        """
        from blocks.optim.factory import reapply_settings

        scheduler = self.trainer.lr_scheduler_configs[0].scheduler
        changed = reapply_settings(self.trainer.optimizers[0], scheduler, self._optim_settings)  # type: ignore[arg-type]
        if changed and self.trainer.is_global_zero:
            log.info(
                "this run's optimizer settings replace the checkpoint's: %s",
                ", ".join(f"{name} {old} -> {new}" for name, (old, new) in changed.items()),
            )

    def configure_optimizers(self) -> Any:
        """The optim block's optimizer with a per-step LR schedule."""
        from blocks.optim.factory import group_settings

        optimizer, scheduler = self.optim_block.build(self.model.named_parameters(), self.total_steps)
        self._optim_settings = group_settings(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _batch_samples(batch: dict[str, Any], valid: torch.Tensor) -> dict[str, Any]:
    """The batch's entries with only the samples *valid* marks.

    A list or tuple as long as the batch holds one item per sample (how a collate function
    batches strings or ragged tensors); a tensor is one row per sample; anything else is kept.
    """
    keep = valid.tolist()

    def entry(value: Any) -> Any:
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields") and len(value) == len(keep):
            return type(value)(item for item, kept in zip(value, keep, strict=True) if kept)
        return _samples(value, valid)

    return {key: entry(value) for key, value in batch.items()}


def _samples(value: Any, valid: torch.Tensor) -> Any:
    """*value* (a tensor, or a dict, list or tuple holding them) with only the samples *valid* marks.

    A tensor is indexed when its first dimension is the batch's; anything else stays as it is.
    """
    if isinstance(value, torch.Tensor):
        return value[valid] if value.dim() and value.shape[0] == valid.shape[0] else value
    if isinstance(value, dict):
        return {key: _samples(item, valid) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_samples(item, valid) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _compiles_what_it_parallelizes(parallelize: Callable[..., None]) -> bool:
    """Whether *parallelize* takes ``compile_mode``: a strategy package's ``(model, device_mesh)`` one does not."""
    return "compile_mode" in inspect.signature(parallelize).parameters
