"""Model blocks: the networks, described torch-free and built lazily."""

from blocks.model.base import ModelBlock
from blocks.model.mlp import MLP
from blocks.model.transformer import Transformer

__all__ = ["MLP", "ModelBlock", "Transformer"]
