"""Runtime objectives behind the task blocks: loss plus validation metrics (torchmetrics)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

Batch = dict[str, torch.Tensor]


class Objective(nn.Module):
    """Loss for training and metrics for validation; metrics sync across processes on ``compute``."""

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


class NextTokenObjective(Objective):
    """Cross-entropy over every position; validation loss is weighted by tokens."""

    def __init__(self, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.label_smoothing = label_smoothing
        self.val_loss = MeanMetric()

    def _token_loss(self, logits: torch.Tensor, targets: torch.Tensor, smoothing: float) -> torch.Tensor:
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), label_smoothing=smoothing
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

    def __init__(self, num_classes: int, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.label_smoothing = label_smoothing
        self.val_loss = MeanMetric()
        self.val_accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Mean cross-entropy."""
        return F.cross_entropy(outputs.float(), batch["targets"], label_smoothing=self.label_smoothing)

    def update(self, outputs: torch.Tensor, batch: Batch) -> None:
        """Add the batch's loss and predictions."""
        targets = batch["targets"]
        self.val_loss.update(F.cross_entropy(outputs.float(), targets), weight=targets.numel())
        self.val_accuracy.update(outputs, targets)

    def compute(self) -> dict[str, torch.Tensor]:
        """Loss and accuracy."""
        return {"loss": self.val_loss.compute(), "accuracy": self.val_accuracy.compute()}
