"""A team's own model for ``model=torch_module`` runs under ``strategy=fsdp`` (named by import path by the tests)."""

from __future__ import annotations

import torch

from blocks.model.networks import Decoder

TINY_LM = {"context": 32, "mlp_ratio": 4, "dropout": 0.0, "tie_weights": True}
"""The ``recipe=tiny_lm`` decoder's settings besides its sizes."""


class OffsetDecoder(Decoder):
    """The ``recipe=tiny_lm`` decoder with a float32 buffer added to the embeddings, before its first unit.

    Under a mixed-precision FSDP policy the sum is float32 between the root and ``layers[0]``,
    whose forward input FSDP casts to the compute dtype.
    """

    def __init__(self, vocab_size: int, d_model: int = 32, n_layers: int = 2, n_heads: int = 2) -> None:
        super().__init__(
            vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads, **TINY_LM
        )
        self.register_buffer("offset", torch.full((d_model,), 0.1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits for the next token, the embeddings shifted by the float32 ``offset``."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions) + self.offset
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class TorchNNLayersDecoder(Decoder):
    """The ``recipe=tiny_lm`` decoder whose units are ``nn.Sequential`` MLP blocks: their forward is torch.nn's own code."""

    def __init__(self, vocab_size: int, d_model: int = 32, n_layers: int = 2) -> None:
        super().__init__(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=2, **TINY_LM)
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.LayerNorm(d_model),
                torch.nn.Linear(d_model, 4 * d_model),
                torch.nn.GELU(),
                torch.nn.Linear(4 * d_model, d_model),
            )
            for _ in range(n_layers)
        )
