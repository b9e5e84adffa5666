"""Data blocks: where samples come from and the batch contract (torch-free until built)."""

from typing import TYPE_CHECKING

from blocks.spec.lazy import lazy_exports

if TYPE_CHECKING:
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

# Importing the package imports none of its blocks: each module loads when a name is first used.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BatchSpec": "blocks.data.base",
        "Blobs": "blocks.data.blobs",
        "DataBlock": "blocks.data.base",
        "Diabetes": "blocks.data.bundled",
        "Digits": "blocks.data.bundled",
        "FeatureBatch": "blocks.data.base",
        "LightningData": "blocks.data.adapter",
        "RegressionBatch": "blocks.data.base",
        "Stream": "blocks.data.stream",
        "Text": "blocks.data.text",
        "TokenBatch": "blocks.data.base",
    },
)
