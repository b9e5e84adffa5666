"""Precision blocks."""

from blocks.precision.base import PrecisionBlock
from blocks.precision.modes import BF16Mixed, BF16True, Float32, FP16Mixed

__all__ = ["BF16Mixed", "BF16True", "FP16Mixed", "Float32", "PrecisionBlock"]
