"""Strategy blocks: how training is spread over processes."""

from blocks.strategy.base import StrategyBlock
from blocks.strategy.ddp import DDP
from blocks.strategy.fsdp import FSDP
from blocks.strategy.single import Single

__all__ = ["DDP", "FSDP", "Single", "StrategyBlock"]
