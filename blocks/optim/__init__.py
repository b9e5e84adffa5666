"""Optimizer blocks: optimizer, LR schedule, accumulation and clipping in one place."""

from typing import TYPE_CHECKING

from blocks.spec.lazy import lazy_exports

if TYPE_CHECKING:
    from blocks.optim.adamw import SGD, AdamW
    from blocks.optim.base import OptimBlock

__all__ = ["SGD", "AdamW", "OptimBlock"]

# Importing the package imports none of its blocks: each module loads when a name is first used.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AdamW": "blocks.optim.adamw",
        "OptimBlock": "blocks.optim.base",
        "SGD": "blocks.optim.adamw",
    },
)
