"""The data kind: what a data block provides and the batch contract it shares with models and tasks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.spec.block import Block

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from blocks.core.plan import CheckContext

SPLITS = ("train", "val", "test")
"""The splits a data block may hold; ``test`` is held out from training and validation alike."""


@dataclass(frozen=True)
class TokenBatch:
    """Batches of token ids: ``inputs`` and ``targets`` are ``int64[batch, seq_len]``.

    Attributes:
        vocab_size: number of distinct token ids.
        seq_len: tokens per sample.
    """

    vocab_size: int
    seq_len: int


@dataclass(frozen=True)
class FeatureBatch:
    """Batches of feature vectors with class labels: ``float32[batch, num_features]`` → ``int64[batch]``.

    Attributes:
        num_features: length of each feature vector.
        num_classes: number of class labels.
    """

    num_features: int
    num_classes: int


@dataclass(frozen=True)
class RegressionBatch:
    """Batches of feature vectors with real-valued targets: ``float32[batch, num_features]`` → ``float32[batch, num_targets]``.

    Attributes:
        num_features: length of each feature vector.
        num_targets: number of values predicted per sample.
    """

    num_features: int
    num_targets: int


BatchSpec = TokenBatch | FeatureBatch | RegressionBatch
"""What a data block yields; models and tasks declare which specs they accept."""


@dataclass(frozen=True, kw_only=True)
class DataBlock(Block):
    """Base of data blocks: a dataset per split plus the batch contract.

    Every item of a built dataset is a dict with ``inputs`` and ``targets`` tensors. A block
    returns 0 from :meth:`num_samples` for a split it does not have (most have no ``test``
    split unless configured), never another split's samples.

    Attributes:
        batch_size: micro-batch per device per forward pass.
        num_workers: DataLoader worker processes per device (0 loads in the training process).
    """

    kind: ClassVar[str] = "data"
    reading_fields: ClassVar[tuple[str, ...]] = ("batch_size", "num_workers")
    """Fields that change how the data is read, not which samples come in which order: a resume may change them."""
    location_fields: ClassVar[tuple[str, ...]] = ()
    """Fields that say where the content is (a path, a URL): when :meth:`content_digest` identifies
    the content, a resume may change them (a copy of the same files elsewhere)."""

    split_fields: ClassVar[tuple[str, ...] | None] = None
    """Fields that decide which samples fall in which split (a seed, the hold-out fractions):
    ``blocks eval`` refuses changing them on the run's own data, which would score trained-on
    samples as held-out ones. None: every field but the reading and location fields."""

    batch_size: int = 32
    num_workers: int = 0

    def split_defining_fields(self) -> tuple[str, ...]:
        """The fields of :attr:`split_fields` (all but the reading and location fields when None)."""
        if self.split_fields is not None:
            return self.split_fields
        skipped = {*self.reading_fields, *self.location_fields}
        return tuple(f.name for f in dataclasses.fields(self) if f.name not in skipped)

    def batch_spec(self) -> BatchSpec:
        """The shape of the batches this block yields (torch-free)."""
        raise NotImplementedError

    def num_samples(self, split: str) -> int:
        """How many samples *split* (one of :data:`SPLITS`) holds (torch-free; 0 when the block has no such split)."""
        raise NotImplementedError

    def build(self, split: str) -> Dataset:
        """The torch dataset for *split* (one of :data:`SPLITS`); imports torch lazily."""
        raise NotImplementedError

    def content_digest(self) -> str | None:
        """What identifies the content this block reads beyond its own fields; None when its fields say it all.

        A resume refuses a checkpoint whose data content differs (a corpus edited, shards
        prepared from other sources): the data position it restores would name other samples.
        Blocks that read files return a digest of what they read; data generated from the
        fields (a seed, a bundled dataset) returns None. Called by the driver before a resume
        and once when a run starts (torch-free).
        """
        return None

    def prepare(self) -> None:
        """Make the data's inputs exist before planning (e.g. tokenize ``data.source`` into the cache).

        Planning is pure: it reads what the data describes and never writes. A block whose
        description must first be produced does that here; the driver and ``blocks plan`` call it
        once, before the plan. In-memory data has nothing to prepare.
        """

    def prepare_node(self, *, global_zero: bool = True) -> None:
        """Write what :meth:`build` reads on this node (a download, say), before any process builds.

        Called as Lightning calls ``LightningDataModule.prepare_data``: by the first process of
        each node while the node's others wait, so that processes never race to write the same
        files. *global_zero*: this is the job's first process (data that one process writes to
        storage every node reads is written there only). In-memory data has nothing to write.
        """

    def preflight(self) -> None:
        """I/O checks the pure plan leaves out, run by the driver before any process starts.

        Raise a :class:`~blocks.spec.errors.BlocksError` when the data cannot be read (shards
        missing from their storage, an unreachable bucket). In-memory data has nothing to check.
        """

    def check(self, ctx: CheckContext) -> None:
        """Batch size and worker count must be sane."""
        ctx.positive("batch_size", self.batch_size)
        ctx.positive("num_workers", self.num_workers, allow_zero=True)


def holdout_sizes(total: int, val_fraction: float, test_fraction: float) -> dict[str, int]:
    """Samples per split when *total* in-memory samples are split by fraction (val and test rounded down)."""
    val = int(total * val_fraction)
    test = int(total * test_fraction)
    return {"train": total - val - test, "val": val, "test": test}


def check_holdout(ctx: CheckContext, val_fraction: float, test_fraction: float) -> None:
    """Both fractions in [0, 1) and together leaving training samples."""
    ctx.within("val_fraction", val_fraction, 0, 1)
    ctx.within("test_fraction", test_fraction, 0, 1)
    if 0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction >= 1:
        ctx.error(
            "test_fraction",
            f"val_fraction {val_fraction:g} + test_fraction {test_fraction:g} hold out every sample",
            f"data.test_fraction={max(0.0, round(min(test_fraction, 0.9 - val_fraction), 4)):g}"
            " (val_fraction + test_fraction below 1)",
            check="split-fractions",
        )
