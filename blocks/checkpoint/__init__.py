"""Checkpoint blocks."""

from blocks.checkpoint.base import Checkpoint, CheckpointBlock

__all__ = ["Checkpoint", "CheckpointBlock"]
