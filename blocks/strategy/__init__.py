"""Strategy blocks: how training is spread over processes."""

from blocks.strategy.base import StrategyBlock
from blocks.strategy.single import Single

__all__ = ["Single", "StrategyBlock"]
