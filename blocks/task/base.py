"""The task kind: the loss a model is trained on and the metrics it is judged by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.data.base import BatchSpec
from blocks.spec.block import Block

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext
    from blocks.task.objectives import Objective


@dataclass(frozen=True, kw_only=True)
class TaskBlock(Block):
    """Base of task blocks: turns model outputs and batch targets into a loss and metrics."""

    kind: ClassVar[str] = "task"
    needs: ClassVar[tuple[type, ...]] = ()
    """Batch spec types this task can score."""

    def metric_names(self) -> tuple[str, ...]:
        """Names of the validation metrics, logged as ``val/<name>``."""
        return ("loss",)

    def build(self, spec: BatchSpec) -> Objective:
        """The runtime objective (an ``nn.Module`` holding the metrics); imports torch lazily."""
        raise NotImplementedError

    def check(self, ctx: CheckContext) -> None:
        """The data must yield batches this task can score."""
        spec = ctx.batch_spec
        if spec is not None and self.needs and not isinstance(spec, self.needs):
            wanted = " or ".join(t.__name__ for t in self.needs)
            ctx.error(
                "",
                f"task={self.block_name} scores {wanted} batches but data={ctx.data.block_name} "
                f"yields {type(spec).__name__}",
                "choose a task that fits the data (task=lm for text, task=classify for labelled features)",
                check="data-task-batch",
                related=("data",),
            )
