"""Trainer settings."""

from blocks.trainer.base import Trainer, TrainerBlock

__all__ = ["Trainer", "TrainerBlock"]
