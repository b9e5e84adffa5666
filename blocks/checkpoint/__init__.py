"""Checkpoint blocks."""

from typing import TYPE_CHECKING

from blocks.spec.lazy import lazy_exports

if TYPE_CHECKING:
    from blocks.checkpoint.base import Checkpoint, CheckpointBlock

__all__ = ["Checkpoint", "CheckpointBlock"]

# Importing the package imports none of its blocks: each module loads when a name is first used.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Checkpoint": "blocks.checkpoint.base",
        "CheckpointBlock": "blocks.checkpoint.base",
    },
)
