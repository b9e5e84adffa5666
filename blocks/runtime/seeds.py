"""Random streams per data-parallel rank: one ``trainer.seed``, a different stream for each share of the data.

Every process seeds its generators with ``trainer.seed`` before the model is built, so the
initial weights are the same on every rank and equal to a one-process run's. Training then
draws per rank (dropout masks, a loader worker's augmentation): ranks that read different
samples must not draw the same numbers. Data-parallel index 0 keeps ``trainer.seed``'s stream,
so its draws are a one-process run's; index *i* > 0 continues from :func:`rank_seed`. Ranks
that read the same samples (one tensor- or pipeline-parallel group) share their index and so
their stream.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytorch_lightning as pl
import torch


def rank_seed(seed: int, data_parallel_index: int) -> int:
    """The seed of data-parallel index *data_parallel_index*'s streams under *seed* (*seed* itself for index 0)."""
    if data_parallel_index == 0:
        return seed
    # Mixed, not seed + index: run seed 1's index 0 must not repeat run seed 0's index 1.
    return int(np.random.SeedSequence([seed, data_parallel_index]).generate_state(1)[0])


class RankStreams(pl.Callback):
    """Gives each data-parallel index its own stream of the global generators once the model is built.

    Build it right after the model: it keeps the host generators' states (Python, NumPy,
    torch) of that moment. Its ``setup`` runs after Lightning set up the process group (DDP
    and FSDP reseed every process with ``trainer.seed`` there) and the datasets were built,
    and before a checkpoint restores each rank's saved states: data-parallel index 0 goes on
    from the kept states, as a one-process run does, and index *i* > 0 seeds every generator
    (CUDA's too) with :func:`rank_seed` (:meth:`start_fresh`). *index_of* gives the data-parallel index of a global
    rank (the plan's mesh).
    """

    def __init__(self, seed: int, index_of: Callable[[int], int]) -> None:
        self.seed = seed
        self.index_of = index_of
        self.built = (random.getstate(), np.random.get_state(), torch.get_rng_state())

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Put this process's generators on its data-parallel index's stream."""
        index = self.index_of(trainer.global_rank)
        if index == 0:
            python, numpy, host = self.built
            random.setstate(python)
            np.random.set_state(numpy)
            torch.set_rng_state(host)
            return
        self.start_fresh(trainer.global_rank)

    def start_fresh(self, rank: int) -> None:
        """Seed every generator of this process (CUDA's too) for global rank *rank*'s data-parallel index.

        Also what a rank with no saved states of its own starts from when a checkpoint of a
        smaller world resumes (:class:`~blocks.runtime.checkpointing.CheckpointCallback`).
        """
        seed = rank_seed(self.seed, self.index_of(rank))
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)  # and every CUDA device's generator
