"""Model blocks: the networks, described torch-free and built lazily."""

from typing import TYPE_CHECKING

from blocks.spec.lazy import lazy_exports

if TYPE_CHECKING:
    from blocks.model.adapter import TorchModule
    from blocks.model.base import ModelBlock
    from blocks.model.mlp import MLP
    from blocks.model.transformer import Transformer

__all__ = ["MLP", "ModelBlock", "TorchModule", "Transformer"]

# Importing the package imports none of its blocks: each module loads when a name is first used.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "MLP": "blocks.model.mlp",
        "ModelBlock": "blocks.model.base",
        "TorchModule": "blocks.model.adapter",
        "Transformer": "blocks.model.transformer",
    },
)
