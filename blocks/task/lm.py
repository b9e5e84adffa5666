"""``task=lm``: next-token prediction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from blocks.data.base import BatchSpec, TokenBatch
from blocks.spec.registry import register
from blocks.task.base import TaskBlock

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext
    from blocks.task.objectives import Objective


@register("lm")
@dataclass(frozen=True, kw_only=True)
class LanguageModeling(TaskBlock):
    """Next-token cross-entropy; validation reports loss (nats per token) and perplexity.

    Attributes:
        label_smoothing: cross-entropy label smoothing in [0, 1).
    """

    needs = (TokenBatch,)

    label_smoothing: float = 0.0

    def metric_names(self) -> tuple[str, ...]:
        """Loss and perplexity."""
        return ("loss", "perplexity")

    def build(self, spec: BatchSpec) -> Objective:
        """A :class:`~blocks.task.objectives.NextTokenObjective`."""
        from blocks.task.objectives import NextTokenObjective

        return NextTokenObjective(label_smoothing=self.label_smoothing)

    def check(self, ctx: CheckContext) -> None:
        """Label smoothing within range."""
        super().check(ctx)
        ctx.within("label_smoothing", self.label_smoothing, 0, 1)
