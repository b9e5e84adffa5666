"""The seeded sample order every data block's training split is read in (torch; imported when building)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class SeededPermutation(Sampler[int]):
    """A permutation of ``range(num_samples)`` drawn from ``seed + epoch`` (or the identity)."""

    def __init__(self, num_samples: int, seed: int, *, shuffle: bool = True) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this at the start of every epoch."""
        self.epoch = epoch

    def indices(self) -> list[int]:
        """The sample order of the current epoch."""
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices())

    def __len__(self) -> int:
        return self.num_samples
