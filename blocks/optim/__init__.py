"""Optimizer blocks: optimizer, LR schedule, accumulation and clipping in one place."""

from blocks.optim.adamw import SGD, AdamW
from blocks.optim.base import OptimBlock

__all__ = ["SGD", "AdamW", "OptimBlock"]
