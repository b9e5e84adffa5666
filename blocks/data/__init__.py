"""Data blocks: where samples come from and the batch contract (torch-free until built)."""

from blocks.data.adapter import LightningData
from blocks.data.base import BatchSpec, DataBlock, FeatureBatch, RegressionBatch, TokenBatch
from blocks.data.blobs import Blobs
from blocks.data.bundled import Diabetes, Digits
from blocks.data.stream import Stream
from blocks.data.text import Text

__all__ = [
    "BatchSpec",
    "Blobs",
    "DataBlock",
    "Diabetes",
    "Digits",
    "FeatureBatch",
    "LightningData",
    "RegressionBatch",
    "Stream",
    "Text",
    "TokenBatch",
]
