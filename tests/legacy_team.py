"""Another team's existing code, written without blocks: a plain nn.Module, a LightningModule, a DataModule.

Also a few aliases of dangerous functions, as a careless (or hostile) module might hold them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

launch = os.system
Shell = subprocess.Popen


class Touch:
    """Creates the file *path* when constructed: the proof, in a test, that a config made code run."""

    def __init__(self, path: str, *args: object, **kwargs: object) -> None:
        open(path, "w").close()


class TinyNet(nn.Module):
    """Two linear layers."""

    def __init__(
        self, in_features: int, num_classes: int, hidden: int = 16, act: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden), act or nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LitNet(pl.LightningModule):
    """A LightningModule with its own training step (model=torch_module refuses it: it would use only forward)."""

    def __init__(self, in_features: int = 8, num_classes: int = 3) -> None:
        super().__init__()
        self.body = TinyNet(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ClustersDM(pl.LightningDataModule):
    """Generated clusters as (features, label) pairs: 192 train, 64 val."""

    def __init__(
        self, num_features: int = 8, num_classes: int = 3, seed: int = 0, batch_size: int = 32
    ) -> None:
        super().__init__()
        self.num_features, self.num_classes, self.seed = num_features, num_classes, seed
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        centers = torch.randn(self.num_classes, self.num_features, generator=gen) * 3
        labels = torch.randint(0, self.num_classes, (256,), generator=gen)
        features = centers[labels] + torch.randn(256, self.num_features, generator=gen) * 0.5
        self.train_set = TensorDataset(features[:192], labels[:192])
        self.val_set = TensorDataset(features[192:], labels[192:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=64)


class PlainLitNet(pl.LightningModule):
    """A LightningModule with only a forward: nothing of it would be ignored, so model=torch_module takes it."""

    def __init__(self, in_features: int = 8, num_classes: int = 3) -> None:
        super().__init__()
        self.body = TinyNet(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _stack(items: list) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


class CollatingDM(ClustersDM):
    """ClustersDM whose train loader brings its own collate_fn (blocks would not use it)."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, collate_fn=_stack)


class WeightedDM(ClustersDM):
    """ClustersDM whose train loader draws with a weighted sampler (blocks would not use it)."""

    def train_dataloader(self) -> DataLoader:
        from torch.utils.data import WeightedRandomSampler

        weights = torch.ones(len(self.train_set))
        return DataLoader(
            self.train_set, batch_size=self.batch_size, sampler=WeightedRandomSampler(weights, 192)
        )


class HookDM(ClustersDM):
    """ClustersDM with its own batch-transfer hooks, as a team writes on-device normalisation.

    The first two count their calls; ``on_after_batch_transfer`` raises, so a run that trained to
    the end never called them.
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.calls = {"on_before_batch_transfer": 0, "transfer_batch_to_device": 0}

    def on_before_batch_transfer(self, batch, dataloader_idx):  # type: ignore[no-untyped-def]
        self.calls["on_before_batch_transfer"] += 1
        return batch

    def transfer_batch_to_device(self, batch, device, dataloader_idx):  # type: ignore[no-untyped-def]
        self.calls["transfer_batch_to_device"] += 1
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch, dataloader_idx):  # type: ignore[no-untyped-def]
        raise RuntimeError("HookDM.on_after_batch_transfer ran")


class RestoredHookDM(HookDM):
    """HookDM with Lightning's own batch-transfer hooks put back: nothing of it goes uncalled."""

    on_before_batch_transfer = pl.LightningDataModule.on_before_batch_transfer
    transfer_batch_to_device = pl.LightningDataModule.transfer_batch_to_device
    on_after_batch_transfer = pl.LightningDataModule.on_after_batch_transfer


class StatefulDM(ClustersDM):
    """ClustersDM that saves and restores state through the checkpoint (blocks' checkpoints would not hold it)."""

    def state_dict(self) -> dict:
        return {"seed": self.seed}

    def load_state_dict(self, state_dict: dict) -> None:
        self.seed = state_dict["seed"]


class TidyDM(ClustersDM):
    """ClustersDM that cleans up at the end of a run and on a crash (blocks would call neither)."""

    def teardown(self, stage: str) -> None:
        self.train_set = self.val_set = None  # type: ignore[assignment]

    def on_exception(self, exception: BaseException) -> None:
        self.teardown("fit")


class PredictingDM(ClustersDM):
    """ClustersDM with a predict loader (blocks has no predict loop)."""

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=64)


class DownloadingDM(ClustersDM):
    """ClustersDM whose ``prepare_data`` "downloads" its data to *root* (``setup`` needs it there) and
    records each call: the process id, a line each, in ``root/prepared``."""

    def __init__(self, root: str, per_node: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.root = Path(root)
        self.prepare_data_per_node = per_node

    def prepare_data(self) -> None:
        with (self.root / "prepared").open("a") as calls:
            calls.write(f"{os.getpid()}\n")
        (self.root / "downloaded").write_text("data")

    def setup(self, stage: str) -> None:
        if not (self.root / "downloaded").exists():
            raise FileNotFoundError(f"{self.root / 'downloaded'}: set up before prepare_data")
        super().setup(stage)


class Jittered(torch.utils.data.Dataset):
    """*pairs* with a random jitter drawn as each sample is loaded: an augmentation, as torchvision's draw theirs."""

    def __init__(self, pairs: TensorDataset) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        features, label = self.pairs[index]
        return features + 0.5 * torch.randn(features.shape), label


class AugmentingDM(ClustersDM):
    """ClustersDM whose samples, training and validation, are jittered as they are loaded."""

    def setup(self, stage: str) -> None:
        super().setup(stage)
        self.train_set = Jittered(self.train_set)  # type: ignore[assignment]
        self.val_set = Jittered(self.val_set)  # type: ignore[assignment]
