"""Trainer settings."""

from typing import TYPE_CHECKING

from blocks.spec.lazy import lazy_exports

if TYPE_CHECKING:
    from blocks.trainer.base import Trainer, TrainerBlock

__all__ = ["Trainer", "TrainerBlock"]

# Importing the package imports none of its blocks: each module loads when a name is first used.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Trainer": "blocks.trainer.base",
        "TrainerBlock": "blocks.trainer.base",
    },
)
