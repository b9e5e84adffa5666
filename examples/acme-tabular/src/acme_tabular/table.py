"""Reading the shipped CSV (imported only when building)."""

from __future__ import annotations

import csv
from importlib.resources import files
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset

if TYPE_CHECKING:
    from acme_tabular.blocks import Orchids

SPECIES = ("alba", "rosea", "viridis")


class Rows(Dataset[dict[str, torch.Tensor]]):
    """Feature rows with species labels."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.features, self.labels = features, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"inputs": self.features[index], "targets": self.labels[index]}


def load_split(block: Orchids, split: str) -> Rows:
    """The train rows (all but the last ``val_rows``) or the val rows."""
    text = files("acme_tabular").joinpath("data/orchids.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    features = torch.tensor([[float(r[k]) for k in list(r)[:-1]] for r in rows])
    labels = torch.tensor([SPECIES.index(r["species"]) for r in rows])
    if block.standardize:
        features = (features - features.mean(0)) / features.std(0)
    cut = len(rows) - block.val_rows
    if split == "train":
        return Rows(features[:cut], labels[:cut])
    if split == "val":
        return Rows(features[cut:], labels[cut:])
    raise ValueError(f"acme/orchids has no {split!r} split (num_samples({split!r}) is 0)")
