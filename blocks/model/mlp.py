"""``model=mlp``: a multi-layer perceptron classifier."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blocks.data.base import BatchSpec, FeatureBatch, RegressionBatch
from blocks.model.base import ModelBlock
from blocks.spec.registry import register

if TYPE_CHECKING:
    from torch import nn

    from blocks.core.plan import CheckContext

ACTIVATIONS = ("relu", "gelu", "tanh", "silu")


@register("mlp")
@dataclass(frozen=True, kw_only=True)
class MLP(ModelBlock):
    """A multi-layer perceptron from feature vectors to class logits (or regression outputs).

    Attributes:
        hidden: widths of the hidden layers, e.g. ``[128, 128]``.
        activation: one of relu, gelu, tanh, silu.
        dropout: dropout after each hidden activation.
    """

    accepts = (FeatureBatch, RegressionBatch)

    hidden: tuple[int, ...] = (128, 128)
    activation: str = "relu"
    dropout: float = 0.0

    def widths(self, spec: FeatureBatch | RegressionBatch) -> list[int]:
        """Layer widths from input features through the hidden layers to the classes (or targets)."""
        out = spec.num_classes if isinstance(spec, FeatureBatch) else spec.num_targets
        return [spec.num_features, *self.hidden, out]

    def num_parameters(self, spec: BatchSpec) -> int:
        """Weights and biases of every linear layer."""
        assert isinstance(spec, FeatureBatch | RegressionBatch)
        widths = self.widths(spec)
        return sum(a * b + b for a, b in itertools.pairwise(widths))

    def activation_elements(self, spec: BatchSpec, micro_batch: int, *, checkpointing: bool) -> int:
        """Per sample: the input, each hidden layer before and after its activation, the logits twice."""
        assert isinstance(spec, FeatureBatch)
        return micro_batch * (spec.num_features + 2 * sum(self.hidden) + 2 * spec.num_classes)

    def build(self, spec: BatchSpec) -> nn.Module:
        """An ``nn.Sequential`` of linear layers and activations."""
        from blocks.model.networks import mlp

        assert isinstance(spec, FeatureBatch | RegressionBatch)
        return mlp(self.widths(spec), self.activation, self.dropout)

    def check(self, ctx: CheckContext) -> None:
        """Widths positive, activation known."""
        super().check(ctx)
        for width in self.hidden:
            if width <= 0:
                ctx.error(
                    "hidden",
                    f"layer widths must be > 0, got {list(self.hidden)}",
                    "model.hidden=[128,128]",
                    check="range",
                )
                break
        ctx.choice("activation", self.activation, ACTIVATIONS)
        ctx.within("dropout", self.dropout, 0, 1)
