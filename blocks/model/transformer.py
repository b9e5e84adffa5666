"""``model=transformer``: a small GPT-style decoder."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blocks.data.base import BatchSpec, TokenBatch
from blocks.model.base import ModelBlock
from blocks.spec.registry import register

if TYPE_CHECKING:
    from torch import nn

    from blocks.core.plan import CheckContext


@register("transformer")
@dataclass(frozen=True, kw_only=True)
class Transformer(ModelBlock):
    """A GPT-style decoder: token + position embeddings, pre-norm causal self-attention layers.

    Its ``layers`` are the units that FSDP shards and activation checkpointing wraps.

    Attributes:
        d_model: width of the residual stream.
        n_layers: number of transformer layers.
        n_heads: attention heads per layer; must divide ``d_model``.
        context: longest sequence the position embedding covers; must be >= ``data.seq_len``.
        mlp_ratio: width of each layer's MLP as a multiple of ``d_model``.
        dropout: dropout on attention and residual branches (0 for exact reproducibility
            across process layouts).
        vocab_size: token vocabulary; unset (null) takes the data's vocabulary.
        tie_weights: share the input embedding with the output head.
    """

    accepts = (TokenBatch,)

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    context: int = 256
    mlp_ratio: int = 4
    dropout: float = 0.0
    vocab_size: int | None = None
    tie_weights: bool = True

    def resolved_vocab(self, spec: TokenBatch) -> int:
        """The vocabulary size: explicit, or the data's."""
        return self.vocab_size if self.vocab_size is not None else spec.vocab_size

    def unit_parameters(self, spec: BatchSpec) -> int:
        """One decoder layer: two norms, attention (qkv and projection) and the MLP."""
        d = self.d_model
        hidden = self.mlp_ratio * d
        return 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * hidden + hidden) + (hidden * d + d)

    def num_parameters(self, spec: BatchSpec) -> int:
        """Embeddings, layers (attention, MLP, norms) and the output head."""
        assert isinstance(spec, TokenBatch)
        d, vocab = self.d_model, self.resolved_vocab(spec)
        head = 0 if self.tie_weights else vocab * d
        return vocab * d + self.context * d + self.n_layers * self.unit_parameters(spec) + 2 * d + head

    def activation_elements(self, spec: BatchSpec, micro_batch: int, *, checkpointing: bool) -> int:
        """Per token: ``(8 + 2 × mlp_ratio) × d_model`` per layer, the final norm, and the logits twice.

        A layer keeps its input and both norms' inputs and outputs (4d), q, k, v (3d), the
        attention output (d) and the MLP's hidden pre- and post-activation (2 × mlp_ratio × d);
        the loss keeps the logits and their log-softmax (2 × vocab).
        """
        assert isinstance(spec, TokenBatch)
        d, vocab = self.d_model, self.resolved_vocab(spec)
        per_layer = (8 + 2 * self.mlp_ratio) * d
        layers = self.n_layers * d + per_layer if checkpointing else self.n_layers * per_layer
        return micro_batch * spec.seq_len * (layers + 2 * d + 2 * vocab)

    def flops_per_sample(self, spec: BatchSpec) -> float:
        """6 × parameters × tokens (matmuls, forward and backward) plus attention's 12 × layers × d × tokens²."""
        assert isinstance(spec, TokenBatch)
        tokens = spec.seq_len
        return (
            6.0 * self.num_parameters(spec) * tokens + 12.0 * self.n_layers * self.d_model * tokens * tokens
        )

    def shard_units(self) -> str:
        """The decoder layers."""
        return "layers"

    def unit_count(self) -> int:
        """``n_layers``."""
        return self.n_layers

    def build(self, spec: BatchSpec) -> nn.Module:
        """A :class:`~blocks.model.networks.Decoder`."""
        from blocks.model.networks import Decoder

        assert isinstance(spec, TokenBatch)
        return Decoder(
            vocab_size=self.resolved_vocab(spec),
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            context=self.context,
            mlp_ratio=self.mlp_ratio,
            dropout=self.dropout,
            tie_weights=self.tie_weights,
        )

    def check(self, ctx: CheckContext) -> None:
        """Shapes must agree with each other and with the data."""
        super().check(ctx)
        for name in ("d_model", "n_layers", "n_heads", "context", "mlp_ratio"):
            ctx.positive(name, getattr(self, name))
        ctx.within("dropout", self.dropout, 0, 1)
        if self.n_heads > 0 and self.d_model % self.n_heads:
            ctx.error(
                "n_heads",
                f"{self.n_heads} heads do not divide d_model={self.d_model}",
                f"model.n_heads={_divisor_near(self.d_model, self.n_heads)}",
                check="heads-divide-width",
                related=("model.d_model",),
            )
        spec = ctx.batch_spec
        if not isinstance(spec, TokenBatch):
            return
        if spec.seq_len > self.context:
            ctx.error(
                "context",
                f"data.seq_len={spec.seq_len} is longer than model.context={self.context}",
                f"model.context={spec.seq_len} or data.seq_len={self.context}",
                check="seq-len-context",
                related=("data.seq_len",),
            )
        if self.vocab_size is not None and self.vocab_size < spec.vocab_size:
            ctx.error(
                "vocab_size",
                f"model.vocab_size={self.vocab_size} is smaller than the data's vocabulary ({spec.vocab_size})",
                "model.vocab_size=null (take it from the data)",
                check="vocab-size",
                related=("data",),
            )


def _divisor_near(n: int, target: int) -> int:
    """A divisor of *n* close to *target*: the closest among the divisor pairs up to a bounded sqrt(n).

    Bounded so that a huge or prime width (``model.d_model=1000000007``, ``2**63``) plans at once.
    """
    limit = min(math.isqrt(max(n, 1)), _DIVISOR_SEARCH_LIMIT)
    divisors = {1}
    for k in range(1, limit + 1):
        if n % k == 0:
            divisors.update((k, n // k))
    return min(divisors, key=lambda d: (abs(d - target), d))


_DIVISOR_SEARCH_LIMIT = 100_000
