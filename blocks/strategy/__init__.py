"""Strategy blocks: how training is spread over processes."""

from typing import TYPE_CHECKING

from blocks.spec.lazy import lazy_exports

if TYPE_CHECKING:
    from blocks.strategy.base import StrategyBlock
    from blocks.strategy.ddp import DDP
    from blocks.strategy.fsdp import FSDP
    from blocks.strategy.single import Single

__all__ = ["DDP", "FSDP", "Single", "StrategyBlock"]

# Importing the package imports none of its blocks: each module loads when a name is first used.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DDP": "blocks.strategy.ddp",
        "FSDP": "blocks.strategy.fsdp",
        "Single": "blocks.strategy.single",
        "StrategyBlock": "blocks.strategy.base",
    },
)
