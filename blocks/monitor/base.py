"""The monitor kind: what a run reports while it trains and how often."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.core.block import Block
from blocks.core.registry import register

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext

PROGRESS = ("auto", "bar", "lines", "off")


@dataclass(frozen=True, kw_only=True)
class MonitorBlock(Block):
    """Base of monitor blocks."""

    kind: ClassVar[str] = "monitor"


@register("default")
@dataclass(frozen=True, kw_only=True)
class Monitor(MonitorBlock):
    """Metrics to ``metrics.csv`` and progress on the console from global rank 0.

    Metrics are accumulated on the device and read back only every ``log_every_n_steps``,
    so logging costs (almost) nothing between rows.

    Attributes:
        log_every_n_steps: optimizer steps between rows of ``metrics.csv`` and progress updates.
        progress: ``auto`` (a live bar on a terminal, plain lines otherwise), ``bar``,
            ``lines`` or ``off``.
        grad_norm: log the global gradient norm (before clipping) at each logged step.
        rank_spread_tolerance: with several processes, warn when the ranks' training losses
            differ by more than this fraction of their mean ((max - min) / mean).
    """

    log_every_n_steps: int = 10
    progress: str = "auto"
    grad_norm: bool = True
    rank_spread_tolerance: float = 0.05

    def check(self, ctx: CheckContext) -> None:
        """Positive interval, known progress mode."""
        ctx.positive("log_every_n_steps", self.log_every_n_steps)
        ctx.choice("progress", self.progress, PROGRESS)
        ctx.positive("rank_spread_tolerance", self.rank_spread_tolerance)
