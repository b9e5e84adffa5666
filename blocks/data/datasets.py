"""Torch datasets behind the built-in data blocks (imported only when building)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset

from blocks.data import corpus

if TYPE_CHECKING:
    from blocks.data.blobs import Blobs
    from blocks.data.text import Text

Sample = dict[str, torch.Tensor]
"""One sample, or (from ``gather``) one batch: tensors by name."""


class TokenWindows(Dataset[Sample]):
    """Non-overlapping windows of ``seq_len + 1`` tokens; item ``i`` predicts window ``i`` shifted by one."""

    draws_while_loading = False  # no random numbers: loading needs no seed (blocks.runtime.datamodule.fetch)

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        self.tokens = tokens
        self.seq_len = seq_len

    @classmethod
    def from_text_block(cls, block: Text, split: str) -> TokenWindows:
        """Tokenize the block's corpus and keep the part for *split*."""
        raw = corpus.corpus_bytes(block.path)
        if block.level == "byte":
            tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
        else:
            alphabet = {ch: i for i, ch in enumerate(corpus.corpus_alphabet(block.path))}
            text = raw.decode("utf-8", errors="replace")
            tokens = torch.tensor([alphabet[ch] for ch in text], dtype=torch.long)
        train, _ = block.split_tokens()
        part = {"train": tokens[:train], "val": tokens[train:]}.get(split, tokens[:0])
        return cls(part, block.seq_len)

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def __getitem__(self, index: int) -> Sample:
        start = index * self.seq_len
        window = self.tokens[start : start + self.seq_len + 1]
        return {"inputs": window[:-1], "targets": window[1:]}

    def gather(self, indices: list[int]) -> Sample:
        """The samples at *indices* as one batch, in one indexing operation (no per-sample calls, no stacking)."""
        starts = torch.tensor(indices, dtype=torch.long).unsqueeze(1) * self.seq_len
        windows = self.tokens[starts + torch.arange(self.seq_len + 1)]
        return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}


class TensorPairs(Dataset[Sample]):
    """Samples from two aligned tensors: features and labels."""

    draws_while_loading = False  # no random numbers: loading needs no seed (blocks.runtime.datamodule.fetch)

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.inputs = inputs
        self.targets = targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> Sample:
        return {"inputs": self.inputs[index], "targets": self.targets[index]}

    def gather(self, indices: list[int]) -> Sample:
        """The samples at *indices* as one batch, one ``index_select`` per tensor.

        The same rows as ``tensor[rows]``, without advanced indexing's parsing of the index: about
        half the time of a small batch's gather, which runs every step.
        """
        rows = torch.tensor(indices, dtype=torch.long)
        return {"inputs": self.inputs.index_select(0, rows), "targets": self.targets.index_select(0, rows)}


def blobs_dataset(block: Blobs, split: str) -> TensorPairs:
    """Generate the blobs set from the block's seed and return *split* of it."""
    gen = torch.Generator().manual_seed(block.seed)
    centers = torch.randn(block.num_classes, block.num_features, generator=gen) * 3.0
    labels = torch.randint(0, block.num_classes, (block.samples,), generator=gen)
    noise = torch.randn(block.samples, block.num_features, generator=gen) * block.spread
    features = centers[labels] + noise
    train, val = block.num_samples("train"), block.num_samples("val")
    # train first, then val, then test: with no test split, val is the tail as it always was
    bounds = {"train": (0, train), "val": (train, train + val), "test": (train + val, block.samples)}
    start, end = bounds.get(split, (0, 0))
    return TensorPairs(features[start:end], labels[start:end])
