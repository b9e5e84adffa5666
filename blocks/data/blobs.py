"""``data=blobs``: a generated classification set (Gaussian blobs), for fast tests and demos."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.data.base import DataBlock, FeatureBatch, check_holdout, holdout_sizes
from blocks.spec.registry import register

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from blocks.core.plan import CheckContext


@register("blobs")
@dataclass(frozen=True, kw_only=True)
class Blobs(DataBlock):
    """Gaussian blobs: one cluster per class in feature space, generated from a seed.

    Attributes:
        samples: total number of samples (train + val + test).
        num_features: feature vector length.
        num_classes: number of clusters, one per class.
        spread: standard deviation of each cluster; larger is harder.
        val_fraction: share of the samples held out for validation.
        test_fraction: share of the samples held out for ``blocks eval --split test``
            (disjoint from train and val; 0 means no test split).
        seed: seed of the generator; the same seed gives the same set.
    """

    split_fields: ClassVar[tuple[str, ...] | None] = ("samples", "val_fraction", "test_fraction", "seed")

    samples: int = 4096
    num_features: int = 32
    num_classes: int = 4
    spread: float = 1.0
    val_fraction: float = 0.1
    test_fraction: float = 0.0
    seed: int = 0

    def batch_spec(self) -> FeatureBatch:
        """Feature vectors with class labels."""
        return FeatureBatch(num_features=self.num_features, num_classes=self.num_classes)

    def num_samples(self, split: str) -> int:
        """Samples in *split*."""
        return holdout_sizes(self.samples, self.val_fraction, self.test_fraction).get(split, 0)

    def build(self, split: str) -> Dataset:
        """The generated split as a tensor dataset."""
        from blocks.data.datasets import blobs_dataset

        return blobs_dataset(self, split)

    def check(self, ctx: CheckContext) -> None:
        """Sizes must be positive and the split must leave training samples."""
        super().check(ctx)
        ctx.positive("samples", self.samples)
        ctx.positive("num_features", self.num_features)
        ctx.positive("spread", self.spread)
        if self.num_classes < 2:
            ctx.error(
                "num_classes",
                f"needs at least 2 classes, got {self.num_classes}",
                "data.num_classes=2",
                check="range",
            )
        check_holdout(ctx, self.val_fraction, self.test_fraction)
