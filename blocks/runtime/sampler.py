"""Samplers that make the global batch stream independent of the process layout.

Each optimizer step consumes one *global batch*: ``global_batch`` consecutive indices of a
seeded permutation of the training split. The global batch is cut into ``accumulate``
micro-steps, and each micro-step into one micro-batch per *data-parallel* rank. So the samples
behind every optimizer step depend only on the seed and the global batch size, not on how many
processes share it or how many micro-batches it is accumulated from.

The data-parallel size and a process's data-parallel index come from the device mesh the plan
recorded (``derived.mesh``), not from the world size and the global rank: the ranks of one
tensor- or pipeline-parallel group read the same micro-batches (:meth:`GlobalBatchSampler.for_rank`).
"""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import Sampler

from blocks.core.plan import Derived
from blocks.data.permutation import SeededPermutation
from blocks.runtime.seeds import batch_seed

__all__ = ["GlobalBatchSampler", "SeededBatch", "SeededPermutation", "ShardedBatchSampler"]


class SeededBatch(list[int]):
    """A micro-batch's sample indices, with the seed of the draws made while loading them (:func:`batch_seed`).

    The loader hands the batch sampler's lists to the dataset's ``__getitems__`` as they are (to a
    worker, pickled), so the seed travels with the indices it belongs to. It is derived from
    *key* (``batch_seed``'s arguments) when a fetch asks for it.
    """

    __slots__ = ("key",)

    def __init__(self, indices: list[int], key: tuple[int, str, int, int]) -> None:
        super().__init__(indices)
        self.key = key

    @property
    def seed(self) -> int:
        """The seed of the batch's draws."""
        return batch_seed(*self.key)

    def __reduce__(self) -> tuple[type[SeededBatch], tuple[list[int], tuple[int, str, int, int]]]:
        return SeededBatch, (list(self), self.key)


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches, in order, for every global batch of the epoch.

    Partial global batches at the end of an epoch are dropped, so every optimizer step
    averages exactly ``micro_batch × world_size × accumulate`` samples. *rank* and
    *world_size* are data-parallel ones: the index of this rank's share and how many shares
    there are (:meth:`for_rank` reads them from a plan's mesh).
    """

    def __init__(
        self,
        sampler: SeededPermutation,
        *,
        micro_batch: int,
        accumulate: int,
        rank: int,
        world_size: int,
    ) -> None:
        self.sampler = sampler
        self.micro_batch = micro_batch
        self.accumulate = accumulate
        self.rank = rank
        self.world_size = world_size
        self.global_batch = micro_batch * accumulate * world_size
        self._resume: tuple[int, int] | None = None

    @classmethod
    def for_rank(cls, sampler: SeededPermutation, derived: Derived, rank: int) -> GlobalBatchSampler:
        """The sampler of global *rank* under a plan's *derived* numbers: its share by the plan's mesh."""
        return cls(
            sampler,
            micro_batch=derived.micro_batch,
            accumulate=derived.accumulate,
            rank=derived.mesh.data_parallel_rank(rank),
            world_size=derived.data_parallel,
        )

    def resume_at(self, *, epoch: int, steps_done: int) -> None:
        """On the next pass over *epoch*, skip the *steps_done* global batches already trained on."""
        self._resume = (epoch, steps_done)
        # Lightning may create the iterator (and worker processes start drawing indices)
        # before it sets the epoch on a resume; the saved epoch is the one to continue.
        self.sampler.set_epoch(epoch)

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch."""
        return self.sampler.num_samples // self.global_batch

    def __len__(self) -> int:
        return self.steps_per_epoch * self.accumulate

    def __iter__(self) -> Iterator[list[int]]:
        order = self.sampler.indices()
        seed, epoch = self.sampler.seed, self.sampler.epoch
        per_micro_step = self.micro_batch * self.world_size
        first = 0
        if self._resume is not None and self._resume[0] == epoch:
            first = self._resume[1]
            self._resume = None
        for step in range(first, self.steps_per_epoch):
            for micro in range(self.accumulate):
                begin = step * self.global_batch + micro * per_micro_step + self.rank * self.micro_batch
                yield SeededBatch(order[begin : begin + self.micro_batch], (seed, "train", epoch, begin))


class ShardedBatchSampler(Sampler[list[int]]):
    """Evaluation batches: contiguous shards per rank, in order, the same count on every rank.

    Every rank must run the same number of batches (FSDP all-gathers in every forward; the
    metric sync waits for all ranks), so the split is padded to a multiple of ``world_size``
    before it is cut into shards. The batches hold *positions* in that padded split: position
    ``p`` is sample ``p % num_samples``, and the up to ``world_size - 1`` positions past the
    end are padding, read as the split's first samples but left out of every metric
    (``datamodule.PaddedSplit`` marks them). *rank* and *world_size* are data-parallel ones
    (:meth:`for_rank`).
    """

    @classmethod
    def for_rank(
        cls, num_samples: int, derived: Derived, rank: int, *, batch_size: int, seed: int = 0
    ) -> ShardedBatchSampler:
        """The evaluation sampler of global *rank* under a plan's *derived* numbers (its shard by the plan's mesh)."""
        return cls(
            num_samples,
            batch_size=batch_size,
            rank=derived.mesh.data_parallel_rank(rank),
            world_size=derived.data_parallel,
            seed=seed,
        )

    def __init__(
        self, num_samples: int, *, batch_size: int, rank: int, world_size: int, seed: int = 0
    ) -> None:
        per_rank = -(-num_samples // world_size)
        self.positions = list(range(rank * per_rank, (rank + 1) * per_rank))
        self.batch_size = batch_size
        self.seed = seed

    def __len__(self) -> int:
        return -(-len(self.positions) // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        """The batches in order; every pass loads each with the same draws (:func:`batch_seed` of its first position)."""
        for begin in range(0, len(self.positions), self.batch_size):
            positions = self.positions[begin : begin + self.batch_size]
            yield SeededBatch(positions, (self.seed, "eval", 0, positions[0]))
