"""The ``callbacks`` kind's base class and its one block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.spec.block import Block

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext


@dataclass(frozen=True, kw_only=True)
class CallbacksBlock(Block):
    """Base of callbacks blocks.

    Attributes:
        every_n_steps: how often the callbacks run.
    """

    kind: ClassVar[str] = "callbacks"

    every_n_steps: int = 10


@dataclass(frozen=True, kw_only=True)
class NoCallbacks(CallbacksBlock):
    """No extra callbacks."""

    def check(self, ctx: CheckContext) -> None:
        """The interval must be positive and fit in training."""
        ctx.positive("every_n_steps", self.every_n_steps)
        if ctx.derived.total_steps and self.every_n_steps > ctx.derived.total_steps:
            ctx.warning("every_n_steps", "never runs before the end of training", "callbacks.every_n_steps=1")
