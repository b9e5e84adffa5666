"""The LightningDataModule built from a data block."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Subset, default_collate

from blocks.compat.torch_private import (
    loader_worker_done_event,
    processed_micro_batches,
    start_programs_with_sigterm_unblocked,
)
from blocks.core.plan import Derived
from blocks.data.base import DataBlock
from blocks.runtime.checkpointing import ResumableLoader
from blocks.runtime.contract import check_split_size
from blocks.runtime.sampler import GlobalBatchSampler, SeededBatch, SeededPermutation, ShardedBatchSampler
from blocks.runtime.seeds import rank_seed, seeded_draws
from blocks.spec.errors import BlocksError, Problem


def collate(fetched: Any) -> Any:
    """Stack samples into a batch, or pass through a batch that a dataset's ``gather`` already made."""
    return fetched if isinstance(fetched, dict) else default_collate(fetched)


def fetch(dataset: Any, indices: list[int], batch: list[int]) -> Any:
    """Samples *indices* of *dataset*, the draws of loading them made from *batch*'s seed (:func:`seeded_draws`).

    *batch* is what the batch sampler yielded (a :class:`~blocks.runtime.sampler.SeededBatch`
    carries the seed; a plain list, none). A dataset whose class sets ``draws_while_loading =
    False`` (blocks' own in-memory and shard datasets) is read unseeded: seeding three
    generators costs ~12 µs a batch. A dataset with a ``gather(indices)`` method gathers them in
    one indexing operation, which saves a call and a copy per sample, a measurable share of a
    small model's step; one with torch's ``__getitems__`` (a batched read) is read with it; any
    other, sample by sample.
    """
    seed = (
        batch.seed
        if isinstance(batch, SeededBatch) and getattr(dataset, "draws_while_loading", True)
        else None
    )
    gather = getattr(dataset, "gather", None)
    if not callable(gather):
        gather = getattr(dataset, "__getitems__", None)
    with seeded_draws(seed):
        return gather(indices) if callable(gather) else [dataset[i] for i in indices]


class BatchedFetch(Dataset):
    """A dataset fetched by the DataLoader one batch at a time (:func:`fetch`).

    The DataLoader calls ``__getitems__`` with a whole batch of indices (the batch sampler's
    :class:`~blocks.runtime.sampler.SeededBatch`) when a dataset has it: the random draws of
    loading them (augmentations) follow from the batch's place in the data, and a resume, or
    another ``data.num_workers``, loads each batch as the uninterrupted run did (a model that
    draws from Python's or NumPy's generator in a step draws differently with and without
    workers: see :func:`~blocks.runtime.seeds.seeded_draws`). The datasets themselves keep
    torch's plain protocol, so they still work with any DataLoader.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> Any:
        """One batch of samples."""
        return fetch(self.dataset, indices, indices)


VALID = "valid"
"""Batch key of the mask :class:`PaddedSplit` adds to a batch that holds padding (True: a sample to count)."""


class PaddedSplit(Dataset):
    """A split read at :class:`ShardedBatchSampler`'s positions: position ``p`` is sample ``p % len``.

    Positions past the end are the padding that gives every rank the same number of batches.
    A batch that holds any carries a boolean :data:`VALID` mask, False there, so validation
    runs the forward on the whole batch but counts each sample of the split exactly once.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.size = len(dataset)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, position: int) -> Any:
        return self.dataset[position % self.size]

    def __getitems__(self, positions: list[int]) -> Any:
        """One batch of samples, with the :data:`VALID` mask when some of *positions* are padding."""
        indices = [position % self.size for position in positions]
        batch = collate(fetch(self.dataset, indices, positions))
        if indices != positions:
            batch[VALID] = torch.tensor([position < self.size for position in positions])
        return batch


def outlive_stop_signals(worker_id: int) -> None:
    """The loaders' ``worker_init_fn``: a loader worker lives on through a SIGTERM or SIGINT sent to the whole job.

    Preemption (SLURM, systemd, ``kill -- -PGID``) and Ctrl-C signal every process of the job,
    not only the one that trains. The training process stops after the step and saves its
    checkpoint, reading batches meanwhile, and shuts its workers down itself; a worker that
    died of the signal failed the run instead, and one that kept the handler it inherited
    announced the signal again and ended itself after ``trainer.shutdown_grace_s``.

    SIGINT is dropped by a handler (not ignored: a program the dataset runs starts with the
    default action). SIGTERM is blocked and taken by a thread, which sees who sent it: sent by
    the parent (the loader ending a worker that did not exit when told), it ends the worker as
    torch's own handler does; from anyone else it is dropped. A thread that was running before
    this function keeps SIGTERM unblocked, and the kernel may hand one to it instead: a handler
    drops it there, and another thread, woken by it, ends the worker if its loader is shutting
    its workers down. A process the worker starts, forked or through :mod:`subprocess`,
    starts with both signals as they were.
    """
    signal.signal(signal.SIGINT, _drop)
    signal.signal(signal.SIGTERM, _drop)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    worker = os.getpid()
    os.register_at_fork(after_in_child=lambda: _default_stop_signals(worker))
    start_programs_with_sigterm_unblocked()
    threading.Thread(target=_end_on_sigterm_from_parent, name="blocks-sigterm", daemon=True).start()
    done = loader_worker_done_event()
    if done is not None:
        handled, wakeup = os.pipe()
        os.set_blocking(wakeup, False)
        signal.set_wakeup_fd(wakeup, warn_on_full_buffer=False)
        threading.Thread(
            target=_end_on_handled_sigterm_once_done,
            args=(handled, done),
            name="blocks-sigterm-handled",
            daemon=True,
        ).start()


def _drop(signum: int, frame: Any) -> None:
    """A signal handler that does nothing."""


def _end_on_handled_sigterm_once_done(handled: int, done: Any) -> None:
    """End the worker at a SIGTERM a handler took once its loader set *done* (before it ends its workers).

    *handled* is the read end of the signal wakeup fd's pipe: the numbers of the signals handled.
    """
    while True:
        if signal.SIGTERM in os.read(handled, 64) and done.is_set():
            os._exit(0)


def _default_stop_signals(worker: int) -> None:
    """In a process forked by the loader worker *worker*: SIGINT and SIGTERM act by default again."""
    if os.getppid() == worker:  # not in the processes that one forks in turn
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        signal.set_wakeup_fd(-1)


def _end_on_sigterm_from_parent() -> None:
    """Wait for SIGTERMs (blocked in the worker's threads); end the worker at one its parent sent."""
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == os.getppid():
            os._exit(0)


class BlocksDataModule(pl.LightningDataModule):
    """Train and val loaders for a data block, with the global batch stream of the plan.

    The batch layout (micro-batch, accumulation, the device mesh, global batch) is the plan's
    derived numbers, passed in; nothing here derives it again. Which share of each global
    batch a process reads is its data-parallel index in the plan's mesh.
    """

    def __init__(self, data: DataBlock, *, derived: Derived, seed: int, overfit_batches: int = 0) -> None:
        super().__init__()
        self.data = data
        self.overfit_batches = overfit_batches
        self.derived = derived
        self.accumulate = derived.accumulate
        self.world_size = derived.world_size
        self.global_batch = derived.global_batch
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.prepared = False

    def prepare_data(self) -> None:
        """The data block's :meth:`~blocks.data.base.DataBlock.prepare_node`, once.

        Lightning calls this on the first process of each node, the others waiting, before each of
        its loops (fit, then validate).
        """
        if not self.prepared:
            self.data.prepare_node(global_zero=self.trainer is None or self.trainer.is_global_zero)
            self.prepared = True

    def setup(self, stage: str) -> None:
        """Build the datasets once per process (refused when the processes are not the ones the plan froze).

        A split whose length is not the block's ``num_samples`` (which the plan's epochs and schedule
        count with) is refused; a dataset without a length is not checked.
        """
        if self.trainer is not None and self.trainer.world_size != self.world_size:
            raise BlocksError(
                Problem(
                    "trainer.devices",
                    f"this job runs {self.trainer.world_size} processes, but its frozen plan was made for "
                    f"{self.world_size} (trainer.devices × trainer.nodes)",
                    "start the workers the way blocks run does (one per device on each node), or plan again",
                )
            )
        if self.train_set is None:
            self.train_set = self.data.build("train")
            check_split_size(self.data, "train", self.train_set)
            if self.overfit_batches:
                # The same few global batches for training and validation: can the model memorize them?
                size = self.overfit_batches * self.global_batch
                self.train_set = Subset(self.train_set, range(min(size, len(self.train_set))))  # type: ignore[arg-type]
                self.val_set = self.train_set
        if self.val_set is None and self.data.num_samples("val") > 0:
            self.val_set = self.data.build("val")
            check_split_size(self.data, "val", self.val_set)

    def _loader_options(self) -> dict[str, Any]:
        """Options shared by the loaders.

        Each loader gets its own generator, so creating an iterator never draws from the global
        RNG (which would shift dropout after a resume). It only seeds the loader's workers, by
        data-parallel index, for what they draw outside loading a batch: the batch samplers
        decide the order, and each batch's seed its augmentations (:func:`fetch`). Workers
        outlive a signal to the whole job (:func:`outlive_stop_signals`).
        """
        rank = self.trainer.global_rank if self.trainer is not None else 0
        workers = self.data.num_workers
        on_gpu = self.trainer is not None and self.trainer.accelerator.__class__.__name__ == "CUDAAccelerator"
        return {
            "collate_fn": collate,
            "num_workers": workers,
            "persistent_workers": workers > 0,
            "worker_init_fn": outlive_stop_signals,
            "pin_memory": on_gpu,
            "generator": torch.Generator().manual_seed(
                rank_seed(self.seed, self.derived.mesh.data_parallel_rank(rank))
            ),
        }

    def _progress(self) -> tuple[int, int]:
        """The current epoch and the micro-batches training has processed in it."""
        assert self.trainer is not None
        return self.trainer.current_epoch, processed_micro_batches(self.trainer)

    def train_dataloader(self) -> DataLoader:
        """Micro-batches of this rank, global batch by global batch; resumable mid-epoch."""
        assert self.train_set is not None and self.trainer is not None
        # A dataset may bring its own seeded order (data=stream reads a few shards at a time).
        own_order = getattr(self.train_set, "epoch_order", None)
        sampler = (
            own_order(self.seed) if callable(own_order) else SeededPermutation(len(self.train_set), self.seed)  # type: ignore[arg-type]
        )
        batches = GlobalBatchSampler.for_rank(sampler, self.derived, self.trainer.global_rank)
        return ResumableLoader(
            BatchedFetch(self.train_set),
            batch_sampler=batches,
            progress=self._progress,
            accumulate=self.accumulate,
            **self._loader_options(),
        )

    def val_dataloader(self) -> DataLoader | list:
        """The validation loader: contiguous shards per rank, padding masked (an empty list without a split)."""
        if self.val_set is None or self.trainer is None:
            return []
        batches = ShardedBatchSampler.for_rank(
            len(self.val_set),  # type: ignore[arg-type]
            self.derived,
            self.trainer.global_rank,
            batch_size=self.data.batch_size,
            seed=self.seed,
        )
        return DataLoader(PaddedSplit(self.val_set), batch_sampler=batches, **self._loader_options())
