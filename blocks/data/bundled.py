"""``data=digits`` and ``data=diabetes``: small real data sets that ship inside scikit-learn.

No download: scikit-learn's wheel carries them. scikit-learn is an optional extra
(``pip install 'blocks[sklearn]'``); without it these blocks fail the plan with that fix.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.data.base import DataBlock, FeatureBatch, RegressionBatch, check_holdout, holdout_sizes
from blocks.spec.registry import register

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from blocks.core.plan import CheckContext

SKLEARN_FIX = "pip install 'blocks[sklearn]' (scikit-learn ships this data set; nothing is downloaded)"


def sklearn_missing() -> bool:
    """Whether scikit-learn cannot be imported (checked without importing it)."""
    return importlib.util.find_spec("sklearn") is None


@dataclass(frozen=True, kw_only=True)
class BundledData(DataBlock):
    """Base of data sets bundled with scikit-learn: a seeded shuffle, then validation and test hold-outs.

    Attributes:
        val_fraction: share of the samples held out for validation.
        test_fraction: share of the samples held out for ``blocks eval --split test``
            (disjoint from train and val; 0 means no test split).
        seed: seed of the shuffle that decides which samples are held out.
    """

    total: ClassVar[int] = 0
    """Samples in the whole set."""

    split_fields: ClassVar[tuple[str, ...] | None] = ("val_fraction", "test_fraction", "seed")

    val_fraction: float = 0.2
    test_fraction: float = 0.0
    seed: int = 0

    def num_samples(self, split: str) -> int:
        """Samples in *split* (the set's size is fixed, so this needs no import)."""
        return holdout_sizes(self.total, self.val_fraction, self.test_fraction).get(split, 0)

    def check(self, ctx: CheckContext) -> None:
        """scikit-learn must be installed; the split must leave training samples."""
        super().check(ctx)
        if sklearn_missing():
            ctx.error(
                "",
                f"data={self.block_name} needs scikit-learn, which is not installed",
                SKLEARN_FIX,
                check="data-extra",
            )
        check_holdout(ctx, self.val_fraction, self.test_fraction)


@register("digits")
@dataclass(frozen=True, kw_only=True)
class Digits(BundledData):
    """Handwritten digits, 8×8 grey images as 64 features in [0, 1], ten classes (scikit-learn's ``load_digits``).

    1797 samples; an MLP reaches about 0.95 validation accuracy in seconds on a CPU.
    """

    total: ClassVar[int] = 1797

    def batch_spec(self) -> FeatureBatch:
        """64 pixel features, ten classes."""
        return FeatureBatch(num_features=64, num_classes=10)

    def build(self, split: str) -> Dataset:
        """The split as a tensor dataset."""
        from blocks.data.sklearn_sets import digits_dataset

        return digits_dataset(self, split)


@register("diabetes")
@dataclass(frozen=True, kw_only=True)
class Diabetes(BundledData):
    """Diabetes progression after a year from ten baseline measurements (scikit-learn's ``load_diabetes``); regression.

    442 samples with standardized features. The target is standardized with the training
    split's mean and deviation when ``standardize_target`` is true, so the loss is in units
    of the target's spread.

    Attributes:
        standardize_target: scale the target to zero mean and unit deviation.
    """

    total: ClassVar[int] = 442
    standardize_target: bool = True

    def batch_spec(self) -> RegressionBatch:
        """Ten features, one target."""
        return RegressionBatch(num_features=10, num_targets=1)

    def build(self, split: str) -> Dataset:
        """The split as a tensor dataset."""
        from blocks.data.sklearn_sets import diabetes_dataset

        return diabetes_dataset(self, split)
