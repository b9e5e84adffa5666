"""The torch side of ``data=stream``: random access to token windows in shards, and their epoch order."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from blocks.data.permutation import SeededPermutation
from blocks.data.shards.cache import ShardCache
from blocks.data.shards.manifest import Manifest, Shard, locate, sample_offsets

Sample = dict[str, torch.Tensor]


class ShardWindows(Dataset[Sample]):
    """Windows of ``seq_len + 1`` tokens in the shards of one split; sample ``i`` is a global id.

    Shards are memory-mapped from local disk (in place, or from the :class:`ShardCache`); a few
    stay open. Touching a shard starts fetching the shards that follow it in the epoch order.
    """

    draws_while_loading = False  # no random numbers: loading needs no seed (blocks.runtime.datamodule.fetch)

    def __init__(
        self,
        manifest: Manifest,
        split: str,
        seq_len: int,
        cache: ShardCache,
        *,
        shuffle_shards: int = 4,
        open_shards: int = 8,
    ) -> None:
        self.shards: tuple[Shard, ...] = manifest.shards(split)
        self.seq_len = seq_len
        self.cache = cache
        self.dtype = np.dtype(manifest.dtype)
        self.offsets = sample_offsets(self.shards, seq_len)
        self.shuffle_shards = shuffle_shards
        self.open_shards = max(open_shards, shuffle_shards + 1)
        self.following: dict[int, list[int]] = {}
        self._open: OrderedDict[int, np.ndarray] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": OrderedDict()}

    def __len__(self) -> int:
        return self.offsets[-1]

    def _tokens(self, shard: int) -> np.ndarray:
        tokens = self._open.get(shard)
        if tokens is None:
            tokens = self._map(self.shards[shard].file)
            self._open[shard] = tokens
            if len(self._open) > self.open_shards:
                self._open.popitem(last=False)
            following = self.following.get(shard, [shard + 1, shard + 2])
            self.cache.fetch_ahead([self.shards[s].file for s in following if s < len(self.shards)])
        else:
            self._open.move_to_end(shard)
        return tokens

    def _map(self, name: str) -> np.ndarray:
        """Memory-map a shard; fetch it again if another process evicted it between fetch and open."""
        for attempt in range(3):
            try:
                return np.memmap(self.cache.path(name), dtype=self.dtype, mode="r")
            except FileNotFoundError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def window(self, index: int) -> np.ndarray:
        """The ``seq_len + 1`` tokens of sample *index*."""
        shard, local = locate(self.offsets, index)
        start = local * self.seq_len
        return np.asarray(self._tokens(shard)[start : start + self.seq_len + 1])

    def __getitem__(self, index: int) -> Sample:
        window = torch.from_numpy(self.window(index).astype(np.int64))
        return {"inputs": window[:-1], "targets": window[1:]}

    def gather(self, indices: list[int]) -> Sample:
        """The samples at *indices* as one batch."""
        windows = torch.from_numpy(np.stack([self.window(i) for i in indices]).astype(np.int64))
        return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}

    def epoch_order(self, seed: int) -> ShardedPermutation:
        """The training order: shards shuffled, then samples shuffled within groups of ``shuffle_shards``."""
        return ShardedPermutation(self, seed, window=self.shuffle_shards)


class ShardedPermutation(SeededPermutation):
    """A seeded order of all samples that reads only ``window`` shards at a time.

    Drawn from ``seed + epoch`` alone: the shard order is a permutation, and the samples of each
    group of ``window`` consecutive shards in that order are permuted among themselves. Like
    :class:`SeededPermutation` it never depends on the world size or the worker count, so the
    global batch stream and exact resume hold unchanged.
    """

    def __init__(self, dataset: ShardWindows, seed: int, *, window: int) -> None:
        super().__init__(len(dataset), seed)
        self.dataset = dataset
        self.window = max(1, window)

    def indices(self) -> list[int]:
        """The sample order of the current epoch; also tells the dataset which shards come next."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        offsets = self.dataset.offsets
        order = torch.randperm(len(offsets) - 1, generator=generator).tolist()
        self.dataset.following = {
            shard: order[pos + 1 : pos + 1 + self.window] for pos, shard in enumerate(order)
        }
        result: list[int] = []
        for begin in range(0, len(order), self.window):
            group = order[begin : begin + self.window]
            ids = torch.cat([torch.arange(offsets[s], offsets[s + 1]) for s in group])
            result.extend(ids[torch.randperm(len(ids), generator=generator)].tolist())
        return result
