"""``task=regress``: regression on real-valued targets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from blocks.data.base import BatchSpec, RegressionBatch
from blocks.spec.registry import register
from blocks.task.base import TaskBlock

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext
    from blocks.task.objectives import Objective

LOSSES = ("mse", "huber")


@register("regress")
@dataclass(frozen=True, kw_only=True)
class Regression(TaskBlock):
    """Mean squared (or Huber) error on real-valued targets; validation reports loss, MAE and R².

    Attributes:
        loss: ``mse`` or ``huber``.
    """

    needs = (RegressionBatch,)

    loss: str = "mse"

    def metric_names(self) -> tuple[str, ...]:
        """Loss, mean absolute error and the coefficient of determination."""
        return ("loss", "mae", "r2")

    def build(self, spec: BatchSpec) -> Objective:
        """A :class:`~blocks.task.objectives.RegressionObjective`."""
        from blocks.task.objectives import RegressionObjective

        assert isinstance(spec, RegressionBatch)
        return RegressionObjective(num_targets=spec.num_targets, loss=self.loss)

    def check(self, ctx: CheckContext) -> None:
        """Known loss."""
        super().check(ctx)
        ctx.choice("loss", self.loss, LOSSES)
