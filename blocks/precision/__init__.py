"""Precision blocks."""

from typing import TYPE_CHECKING

from blocks.spec.lazy import lazy_exports

if TYPE_CHECKING:
    from blocks.precision.base import PrecisionBlock
    from blocks.precision.modes import BF16Mixed, BF16True, Float32, FP16Mixed

__all__ = ["BF16Mixed", "BF16True", "FP16Mixed", "Float32", "PrecisionBlock"]

# Importing the package imports none of its blocks: each module loads when a name is first used.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BF16Mixed": "blocks.precision.modes",
        "BF16True": "blocks.precision.modes",
        "FP16Mixed": "blocks.precision.modes",
        "Float32": "blocks.precision.modes",
        "PrecisionBlock": "blocks.precision.base",
    },
)
