"""The hand-written Lightning script that ``blocks run`` is timed against: build, then one training step.

Usage: ``python lightning_first_step.py FEATURES HIDDEN CLASSES BATCH SAMPLES``, with this checkout on
``PYTHONPATH``. It generates SAMPLES random samples, as many as the ``blobs`` data ``blocks run`` is
timed with generates, and carries the benchmark's clock (:mod:`benchmarks.first_step_clock`), as
the ``blocks run`` it is compared with does.
"""

import sys

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.first_step_clock import FirstStepClock


class Classifier(pl.LightningModule):
    """An MLP classifier trained with AdamW."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = F.cross_entropy(self.model(inputs), targets)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    features, hidden, classes, batch, samples = map(int, sys.argv[1:6])
    pl.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(samples, features), torch.randint(0, classes, (samples,)))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=pl.loggers.CSVLogger("."),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[FirstStepClock()],
    )
    trainer.fit(Classifier(features, hidden, classes), DataLoader(data, batch_size=batch))


if __name__ == "__main__":
    main()
