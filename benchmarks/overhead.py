"""Step overhead: one model, data and optimizer trained through blocks, hand-written Lightning and plain torch.

Four loops train the same MLP with AdamW on the same amount of random data, one thread each:

- *plain torch*: a ``for`` loop over a ``DataLoader`` that reads the loss every 10 steps (and
  the same loop with ``AdamW(fused=True)``, which blocks' ``optim=adamw`` uses where it can);
- *Lightning, self.log every step*: the LightningModule most people write first;
- *Lightning, self.log every 10 steps*: the same module logging at blocks' interval;
- *blocks*: the ``blobs`` recipe with the same sizes, built by ``blocks.runtime`` (grad-norm
  logging at each logged step included, as by default; progress output off).

Throughput is counted from the first step after warmup to the end of training.
"""

from __future__ import annotations

import itertools
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import Figure, interleaved, judged, median_ratio, rounded

LOG_EVERY = 10


@dataclass(frozen=True)
class Workload:
    """An MLP classification workload.

    Attributes:
        label: how tables name it.
        features: input width.
        hidden: hidden layer widths.
        classes: output width.
        batch: samples per step.
        steps: optimizer steps per measured run.
        warmup: steps before the clock starts.
    """

    label: str
    features: int
    hidden: tuple[int, ...]
    classes: int
    batch: int
    steps: int
    warmup: int

    @property
    def samples(self) -> int:
        """Training samples: one epoch covers every step."""
        return (self.steps + 1) * self.batch


def workloads(quick: bool) -> list[Workload]:
    """The small model where overhead shows and a compute-bound one where it should vanish."""
    scale = 1 if quick else 3
    return [
        Workload("small MLP 64-128-10, batch 64", 64, (128,), 10, 64, steps=1500 * scale, warmup=100),
        Workload("compute-bound MLP 512-2048-2048-10, batch 256", 512, (2048, 2048), 10, 256, 40 * scale, 5),
    ]


def _mlp(workload: Workload) -> Any:
    from torch import nn

    widths = [workload.features, *workload.hidden, workload.classes]
    layers: list[nn.Module] = []
    for index, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if index < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _loader(workload: Workload) -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(workload.samples, workload.features, generator=generator)
    targets = torch.randint(0, workload.classes, (workload.samples,), generator=generator)
    return DataLoader(TensorDataset(inputs, targets), batch_size=workload.batch, shuffle=True, drop_last=True)


def plain_torch(workload: Workload, fused: bool | None = None) -> float:
    """Samples/s of a hand-written PyTorch loop (torch's default AdamW, or the *fused* one)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = _mlp(workload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    losses = []
    started = 0.0
    for step, (inputs, targets) in enumerate(_loader(workload)):
        if step == workload.warmup:
            started = time.perf_counter()
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % LOG_EVERY == 0:
            losses.append(loss.item())
        if step + 1 == workload.steps:
            break
    return (workload.steps - workload.warmup) * workload.batch / (time.perf_counter() - started)


def step_timer(warmup: int) -> Any:
    """A Lightning callback that times training from the step after *warmup* to the end."""
    import pytorch_lightning as pl

    class StepTimer(pl.Callback):
        def __init__(self) -> None:
            self.started: float | None = None
            self.first_step = 0
            self.seconds = 0.0
            self.steps = 0

        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            if self.started is None and trainer.global_step == warmup:
                self.started, self.first_step = time.perf_counter(), trainer.global_step

        def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            assert self.started is not None, "training ended before the warmup did"
            self.seconds = time.perf_counter() - self.started
            self.steps = trainer.global_step - self.first_step

    return StepTimer()


def hand_written_lightning(workload: Workload, log_every: int, root: Path) -> float:
    """Samples/s of a hand-written LightningModule + Trainer that logs the loss every *log_every* steps."""
    import pytorch_lightning as pl
    import torch
    import torch.nn.functional as F
    from pytorch_lightning.loggers import CSVLogger

    class HandWritten(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _mlp(workload)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, targets = batch
            loss = F.cross_entropy(self.model(inputs), targets)
            if self.global_step % log_every == 0:
                self.log("train/loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    timer = step_timer(workload.warmup)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=workload.steps,
        logger=CSVLogger(root),
        log_every_n_steps=LOG_EVERY,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[timer],
    )
    trainer.fit(HandWritten(), train_dataloaders=_loader(workload))
    return timer.steps * workload.batch / timer.seconds


def blocks_overrides(workload: Workload) -> list[str]:
    """The ``blobs`` recipe at the workload's sizes, without clipping, schedule or progress output."""
    return [
        "recipe=blobs",
        f"data.samples={workload.samples}",
        f"data.num_features={workload.features}",
        f"data.num_classes={workload.classes}",
        "data.val_fraction=0",
        f"data.batch_size={workload.batch}",
        f"model.hidden=[{','.join(map(str, workload.hidden))}]",
        "optim.grad_clip=null",
        "optim.schedule=constant",
        "optim.weight_decay=0.01",
        f"trainer.max_steps={workload.steps}",
        "trainer.max_epochs=null",
        "trainer.val_every=null",
        "checkpoint.enabled=false",
        f"monitor.log_every_n_steps={LOG_EVERY}",
        "monitor.progress=off",
    ]


def through_blocks(workload: Workload, root: Path) -> float:
    """Samples/s of the same training built by blocks (in this process, as ``blocks run`` would)."""
    from blocks.launch import driver
    from blocks.runtime.trainer import build_run

    run_dir = Path(tempfile.mkdtemp(dir=root))
    plan = driver.prepare(blocks_overrides(workload), run_dir)
    built = build_run(plan, run_dir, console=False)
    timer = step_timer(workload.warmup)
    built.trainer.callbacks.append(timer)  # type: ignore[attr-defined]
    built.trainer.fit(built.module, datamodule=built.datamodule)
    built.recorder.close()
    return timer.steps * workload.batch / timer.seconds


def run(quick: bool, root: Path) -> list[Figure]:
    """Measure every workload under the four loops and report the ratios."""
    import torch

    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    figures: list[Figure] = []
    try:
        for workload in workloads(quick):
            cases: dict[str, Callable[[], float]] = {
                "torch": lambda w=workload: plain_torch(w),
                "torch_fused": lambda w=workload: plain_torch(w, fused=True),
                "lightning_every_step": lambda w=workload: hand_written_lightning(w, 1, root),
                "lightning_interval": lambda w=workload: hand_written_lightning(w, LOG_EVERY, root),
                "blocks": lambda w=workload: through_blocks(w, root),
            }
            cases["torch"]()  # warm caches and imports outside the measurement
            samples = interleaved(cases, repeats=5 if quick else 7)
            small = workload.hidden == (128,)
            detail = rounded(samples, 1, "_samples_per_s")
            figures += [
                judged(
                    "overhead",
                    f"blocks / plain torch, {workload.label}",
                    median_ratio(samples["blocks"], samples["torch"]),
                    ">= 0.85" if small else ">= 0.98",
                    **detail,
                ),
                judged(
                    "overhead",
                    f"blocks / Lightning logging every {LOG_EVERY} steps, worst round, {workload.label}",
                    min(a / b for a, b in zip(samples["blocks"], samples["lightning_interval"], strict=True)),
                    ">= 1.0" if small else ">= 0.98",
                ),
                Figure(
                    "overhead",
                    f"blocks / plain torch with fused AdamW, {workload.label}",
                    median_ratio(samples["blocks"], samples["torch_fused"]),
                ),
                Figure(
                    "overhead",
                    f"Lightning self.log every step / plain torch, {workload.label}",
                    median_ratio(samples["lightning_every_step"], samples["torch"]),
                ),
                Figure(
                    "overhead",
                    f"Lightning logging every {LOG_EVERY} steps / plain torch, {workload.label}",
                    median_ratio(samples["lightning_interval"], samples["torch"]),
                ),
            ]
    finally:
        torch.set_num_threads(threads)
    return figures
