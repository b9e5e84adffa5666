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

import contextlib
import hashlib
import random
from collections.abc import Callable, Iterator

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import get_worker_info


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


def batch_seed(seed: int, split: str, epoch: int, position: int) -> int:
    """The seed of the draws made while loading the micro-batch at *position* of *split*'s order in *epoch*.

    A function of the batch's place in the data alone, so that a dataset's augmentations are the
    same after a resume, whichever loader worker (or the training process) loads the batch.
    """
    key = f"{seed}/{split}/{epoch}/{position}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


@contextlib.contextmanager
def seeded_draws(seed: int | None) -> Iterator[None]:
    """Seed the host generators (torch's, Python's, NumPy's) with *seed* for the draws made inside (None: leave them).

    In the training process (a loader without workers) torch's generator is put back after, so
    loading does not move the model's stream (dropout); Python's and NumPy's, which a model
    rarely draws from in a step, are left seeded by the batch (putting NumPy's back costs
    ~0.1 ms a batch), which is as reproducible across a resume, though a model drawing from
    them draws otherwise than with loader workers (which leave the training process's alone).
    """
    if seed is None:
        yield
        return
    host = torch.default_generator
    kept = host.get_state() if get_worker_info() is None else None
    host.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed >> 32)
    try:
        yield
    finally:
        if kept is not None:
            host.set_state(kept)
