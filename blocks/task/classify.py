"""``task=classify``: single-label classification."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from blocks.data.base import BatchSpec, FeatureBatch
from blocks.spec.registry import register
from blocks.task.base import TaskBlock

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext
    from blocks.task.objectives import Objective


@register("classify")
@dataclass(frozen=True, kw_only=True)
class Classification(TaskBlock):
    """Cross-entropy over class logits; validation reports loss and accuracy.

    Attributes:
        label_smoothing: cross-entropy label smoothing in [0, 1).
    """

    needs = (FeatureBatch,)

    label_smoothing: float = 0.0

    def metric_names(self) -> tuple[str, ...]:
        """Loss and accuracy."""
        return ("loss", "accuracy")

    def build(self, spec: BatchSpec) -> Objective:
        """A :class:`~blocks.task.objectives.ClassificationObjective`."""
        from blocks.task.objectives import ClassificationObjective

        assert isinstance(spec, FeatureBatch)
        return ClassificationObjective(num_classes=spec.num_classes, label_smoothing=self.label_smoothing)

    def check(self, ctx: CheckContext) -> None:
        """Label smoothing within range."""
        super().check(ctx)
        ctx.within("label_smoothing", self.label_smoothing, 0, 1)
