"""The checkpoint kind: where and when training state is saved, and what a run resumes from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.core.block import Block
from blocks.core.registry import register

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext


@dataclass(frozen=True, kw_only=True)
class CheckpointBlock(Block):
    """Base of checkpoint blocks."""

    kind: ClassVar[str] = "checkpoint"


@register("default")
@dataclass(frozen=True, kw_only=True)
class Checkpoint(CheckpointBlock):
    """Full training state saved to any fsspec URL, with retention and automatic resume.

    Attributes:
        dir: where checkpoints go (local path or fsspec URL such as ``s3://bucket/run``);
            null means ``checkpoints/`` in the run dir.
        every_n_steps: save every N optimizer steps; 0 saves only at the end of training.
        keep_last: how many of the newest checkpoints to keep (at least 1).
        resume: ``auto`` continues from the newest checkpoint in ``dir`` if there is one,
            ``never`` starts fresh, a URL resumes from that checkpoint or fails.
        enabled: false turns saving and resuming off.
        save_weights: write the final consolidated weights to ``model.safetensors`` in the run dir.
    """

    dir: str | None = None
    every_n_steps: int = 0
    keep_last: int = 2
    resume: str = "auto"
    enabled: bool = True
    save_weights: bool = True

    def check(self, ctx: CheckContext) -> None:
        """Non-negative interval, at least one kept checkpoint."""
        ctx.positive("every_n_steps", self.every_n_steps, allow_zero=True)
        ctx.positive("keep_last", self.keep_last)
        if not self.resume:
            ctx.error("resume", "must be 'auto', 'never' or a checkpoint URL", "checkpoint.resume=auto")
