"""The torch module behind ``model=acme/resnet_mlp``."""

from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    """``x + W2 relu(W1 norm(x))``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.inner = nn.Linear(width, width)
        self.outer = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One residual update."""
        return x + self.outer(torch.relu(self.inner(self.norm(x))))


class ResidualMLPNet(nn.Module):
    """Stem, residual blocks, head."""

    def __init__(self, num_features: int, num_classes: int, width: int, depth: int) -> None:
        super().__init__()
        self.stem = nn.Linear(num_features, width)
        self.blocks = nn.ModuleList(ResidualBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits."""
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)
