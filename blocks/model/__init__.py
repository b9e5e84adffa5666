"""Model blocks: the networks, described torch-free and built lazily."""

from blocks.model.adapter import TorchModule
from blocks.model.base import ModelBlock
from blocks.model.mlp import MLP
from blocks.model.transformer import Transformer

__all__ = ["MLP", "ModelBlock", "TorchModule", "Transformer"]
