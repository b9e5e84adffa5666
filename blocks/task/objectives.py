"""Runtime objectives behind the task blocks: loss plus validation metrics (torchmetrics)."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanAbsoluteError, MeanMetric, Metric, R2Score
from torchmetrics.classification import MulticlassAccuracy

from blocks.spec.errors import BlocksError, Problem

Batch = dict[str, torch.Tensor]


class Objective(nn.Module):
    """Loss for training and metrics for validation; metrics sync across processes on ``compute``.

    ``scores_spec_layout``: whether the model's outputs must have the layout the batch spec
    implies (logits per class or token, one value per target); the run checks the first batch's
    outputs against it (:mod:`blocks.runtime.contract`). An objective reading outputs of a layout
    of its own (a mean and a variance per target, say) leaves it False.
    """

    scores_spec_layout: ClassVar[bool] = False

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The mean training loss of one micro-batch."""
        raise NotImplementedError

    def update(self, outputs: torch.Tensor, batch: Batch) -> None:
        """Accumulate validation metrics for one batch."""
        raise NotImplementedError

    def compute(self) -> dict[str, torch.Tensor]:
        """Validation metrics over everything since the last ``reset``, by name."""
        raise NotImplementedError

    def reset(self) -> None:
        """Clear the accumulated validation metrics."""
        for metric in self.children():
            reset = getattr(metric, "reset", None)
            if reset is not None:
                reset()

    def keep_metrics_float32(self) -> None:
        """Widen metric states that a half-precision conversion narrowed back to float32.

        A ``bf16-true``/``16-true`` precision converts the whole module, metrics included
        (``module.to(bfloat16)`` casts torchmetrics' floating states); sums over a validation
        split in bfloat16 lose digits, and how many depends on how the split is spread over
        processes. ``Metric.to(float32)`` casts floating states (and their reset values) only,
        so integer counts (accuracy's) stay integers.
        """
        for metric in self.modules():
            if isinstance(metric, Metric) and any(_is_half(state) for state in metric.metric_state.values()):
                metric.to(torch.float32)


def _is_half(state: torch.Tensor | list[torch.Tensor]) -> bool:
    """Whether a metric state (a tensor, or a list of them) is float16 or bfloat16."""
    tensors = state if isinstance(state, list) else [state]
    return any(tensor.dtype in (torch.float16, torch.bfloat16) for tensor in tensors)


class NextTokenObjective(Objective):
    """Cross-entropy over every position; validation loss is weighted by tokens."""

    scores_spec_layout = True

    def __init__(self, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.label_smoothing = label_smoothing
        self.val_loss = MeanMetric()

    def _token_loss(self, logits: torch.Tensor, targets: torch.Tensor, smoothing: float) -> torch.Tensor:
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            targets.reshape(-1).long(),
            label_smoothing=smoothing,
        )

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Mean next-token cross-entropy."""
        return self._token_loss(outputs, batch["targets"], self.label_smoothing)

    def update(self, outputs: torch.Tensor, batch: Batch) -> None:
        """Add the batch's unsmoothed loss, weighted by its token count."""
        targets = batch["targets"]
        self.val_loss.update(self._token_loss(outputs, targets, 0.0), weight=targets.numel())

    def compute(self) -> dict[str, torch.Tensor]:
        """Loss and perplexity."""
        loss = self.val_loss.compute()
        return {"loss": loss, "perplexity": torch.exp(loss)}


class ClassificationObjective(Objective):
    """Cross-entropy over class logits; accuracy for validation."""

    scores_spec_layout = True

    def __init__(self, num_classes: int, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.label_smoothing = label_smoothing
        self.val_loss = MeanMetric()
        self.val_accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Mean cross-entropy against class ids or class probabilities."""
        return F.cross_entropy(
            outputs.float(), _cross_entropy_targets(batch["targets"]), label_smoothing=self.label_smoothing
        )

    def update(self, outputs: torch.Tensor, batch: Batch) -> None:
        """Add the batch's loss and predictions (scored against the most probable class of probability targets)."""
        targets = _cross_entropy_targets(batch["targets"])
        outputs = outputs.float()
        self.val_loss.update(F.cross_entropy(outputs, targets), weight=targets.shape[0])
        self.val_accuracy.update(outputs, targets.argmax(-1) if targets.is_floating_point() else targets)

    def compute(self) -> dict[str, torch.Tensor]:
        """Loss and accuracy."""
        return {"loss": self.val_loss.compute(), "accuracy": self.val_accuracy.compute()}


def _cross_entropy_targets(targets: torch.Tensor) -> torch.Tensor:
    """Class ids as int64 (cross-entropy takes no other integer dtype), class probabilities as they are."""
    return targets if targets.is_floating_point() else targets.long()


class RegressionObjective(Objective):
    """Mean squared (or Huber) error; validation adds mean absolute error and R²."""

    scores_spec_layout = True

    def __init__(self, num_targets: int, loss: str = "mse") -> None:
        super().__init__()
        self.loss_fn = F.huber_loss if loss == "huber" else F.mse_loss
        self.val_loss = MeanMetric()
        self.val_mae = MeanAbsoluteError(num_outputs=num_targets)
        self.val_r2 = R2Score(multioutput="uniform_average") if num_targets > 1 else R2Score()

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The mean error of one micro-batch (outputs and targets of different shapes are refused, not broadcast)."""
        refuse_other_shapes(outputs, batch["targets"])
        return self.loss_fn(outputs.float(), batch["targets"].float())

    def update(self, outputs: torch.Tensor, batch: Batch) -> None:
        """Add the batch's loss, absolute errors and predictions."""
        refuse_other_shapes(outputs, batch["targets"])
        targets = batch["targets"].float()
        outputs = outputs.float()
        self.val_loss.update(self.loss_fn(outputs, targets), weight=targets.shape[0])
        flat = targets.shape[-1] == 1
        self.val_mae.update(
            outputs.squeeze(-1) if flat else outputs, targets.squeeze(-1) if flat else targets
        )
        self.val_r2.update(outputs.squeeze(-1) if flat else outputs, targets.squeeze(-1) if flat else targets)

    def compute(self) -> dict[str, torch.Tensor]:
        """Loss, MAE and R² (MAE averaged over targets)."""
        return {
            "loss": self.val_loss.compute(),
            "mae": self.val_mae.compute().mean(),
            "r2": self.val_r2.compute(),
        }


def refuse_other_shapes(outputs: torch.Tensor, targets: torch.Tensor) -> None:
    """Raise a :class:`BlocksError` unless *outputs* and *targets* have the same shape.

    An elementwise loss broadcasts ``[B, 1]`` against ``[B]`` to ``[B, B]``: every output is
    scored against every target and the model learns their mean, without an error.
    """
    if outputs.shape != targets.shape:
        raise BlocksError(
            Problem(
                "model",
                f"regression outputs of shape {list(outputs.shape)} and targets of shape {list(targets.shape)} "
                "differ (a loss would broadcast them, scoring every output against every target)",
                "make the model return [batch, num_targets] and the data's targets [batch, num_targets], as "
                "RegressionBatch declares",
                related=("data",),
            )
        )
