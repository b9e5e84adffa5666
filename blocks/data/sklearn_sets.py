"""Torch datasets behind the scikit-learn data blocks (imported only when building)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from blocks.data.bundled import SKLEARN_FIX, BundledData
from blocks.data.datasets import TensorPairs
from blocks.spec.errors import BlocksError, Problem

if TYPE_CHECKING:
    from blocks.data.bundled import Diabetes, Digits


def _load(name: str, block: BundledData) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        import sklearn.datasets
    except ImportError:
        raise BlocksError(
            Problem(
                "data", f"data={block.block_name} needs scikit-learn, which is not installed", SKLEARN_FIX
            )
        ) from None
    features, targets = getattr(sklearn.datasets, name)(return_X_y=True)
    return torch.as_tensor(features, dtype=torch.float32), torch.as_tensor(targets)


def _split(block: BundledData, split: str, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Shuffle with the block's seed; validation takes the first ``num_samples('val')``, test the next ``num_samples('test')``, train the rest."""
    order = torch.randperm(block.total, generator=torch.Generator().manual_seed(block.seed))
    val, test = block.num_samples("val"), block.num_samples("test")
    index = {"val": order[:val], "test": order[val : val + test], "train": order[val + test :]}.get(
        split, order[:0]
    )
    return [t[index] for t in tensors]


def digits_dataset(block: Digits, split: str) -> TensorPairs:
    """Pixels scaled to [0, 1] and int64 labels for *split*."""
    features, labels = _load("load_digits", block)
    features, labels = _split(block, split, features / 16.0, labels.long())
    return TensorPairs(features, labels)


def diabetes_dataset(block: Diabetes, split: str) -> TensorPairs:
    """Features and ``float32[n, 1]`` targets for *split* (standardized with the training split's statistics)."""
    features, targets = _load("load_diabetes", block)
    targets = targets.float().unsqueeze(1)
    if block.standardize_target:
        (train_targets,) = _split(block, "train", targets)
        targets = (targets - train_targets.mean()) / train_targets.std()
    features, targets = _split(block, split, features, targets)
    return TensorPairs(features, targets)
