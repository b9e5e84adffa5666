"""Torch-side helpers of the data adapter (imported only when building)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset


class DictSamples(Dataset[dict[str, torch.Tensor]]):
    """A dataset whose items become ``{inputs, targets}`` dicts (from dicts or ``(x, y)`` pairs)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = self.dataset[index]
        if isinstance(item, dict):
            return {"inputs": torch.as_tensor(item["inputs"]), "targets": torch.as_tensor(item["targets"])}
        inputs, targets = item
        return {"inputs": torch.as_tensor(inputs), "targets": torch.as_tensor(targets)}
