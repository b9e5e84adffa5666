"""The trainer settings: how long to train, on what hardware, with which seed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.spec.block import Block
from blocks.spec.registry import register

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext

ACCELERATORS = ("auto", "cpu", "gpu")


MAX_SEED = 2**32 - 1
"""The largest seed NumPy and Lightning accept (seeds are unsigned 32-bit)."""


@dataclass(frozen=True, kw_only=True)
class TrainerBlock(Block):
    """Base of trainer settings blocks: the fields the plan, build and launch layers read.

    A trainer block of another package subclasses this base and gets the same treatment as the
    built-in: every layer reads only what is declared here.

    Attributes:
        max_steps: optimizer steps to train; null means until ``max_epochs``.
        max_epochs: passes over the training split; null means until ``max_steps``.
            With both set, training stops at whichever comes first.
        devices: devices (processes) per node.
        nodes: machines.
        accelerator: ``auto`` (a GPU when there is one), ``cpu`` or ``gpu``.
        seed: seeds weights, data order and every random number generator.
        val_every: validate every N optimizer steps; null validates at the end of each epoch.
            The end of training is always validated.
        max_failures: restarts after a failure before the job gives up.
        deterministic: make torch use deterministic algorithms (slower on GPU).
        device_memory_gb: memory of one device in GiB, for the plan's memory estimate; null
            detects it on the planning machine (GPU memory with ``nvidia-smi``, or the host's
            memory shared by ``devices`` on CPU), which may not be the machine that trains.
        overfit_batches: train and validate on only the first N global batches of the
            training split (a debugging check that the model can memorize them); 0 disables.
    """

    kind: ClassVar[str] = "trainer"

    max_steps: int | None = None
    max_epochs: int | None = 1
    devices: int = 1
    nodes: int = 1
    accelerator: str = "auto"
    seed: int = 0
    val_every: int | None = None
    max_failures: int = 0
    deterministic: bool = False
    device_memory_gb: float | None = None
    overfit_batches: int = 0


@register("default")
@dataclass(frozen=True, kw_only=True)
class Trainer(TrainerBlock):
    """Length of training, hardware, seed and validation cadence.

    Its fields are declared on :class:`TrainerBlock`.
    """

    def check(self, ctx: CheckContext) -> None:
        """Training length set, hardware counts positive, accelerator known."""
        if self.max_steps is None and self.max_epochs is None:
            ctx.error(
                "max_steps",
                "neither trainer.max_steps nor trainer.max_epochs is set",
                "trainer.max_steps=1000",
                check="training-length",
                related=("trainer.max_epochs",),
            )
        ctx.positive("max_steps", self.max_steps)
        ctx.positive("max_epochs", self.max_epochs)
        ctx.positive("devices", self.devices)
        ctx.positive("nodes", self.nodes)
        ctx.positive("val_every", self.val_every)
        ctx.positive("max_failures", self.max_failures, allow_zero=True)
        ctx.positive("device_memory_gb", self.device_memory_gb)
        ctx.positive("overfit_batches", self.overfit_batches, allow_zero=True)
        if not 0 <= self.seed <= MAX_SEED:
            ctx.error(
                "seed",
                f"must be in [0, {MAX_SEED}] (seeds are unsigned 32-bit), got {self.seed}",
                f"trainer.seed={self.seed % (MAX_SEED + 1)}",
                check="range",
            )
        ctx.choice("accelerator", self.accelerator, ACCELERATORS)
        gpus = ctx.environment.gpus
        if self.accelerator == "gpu" and gpus and self.nodes == 1 and self.devices > gpus:
            ctx.warning(
                "devices",
                f"trainer.devices={self.devices} but this machine has {gpus} GPU(s); the job fails unless it runs elsewhere",
                f"trainer.devices={gpus}",
                check="devices-available",
            )
        if self.accelerator == "gpu" and gpus == 0 and ctx.derived.world_size == self.devices:
            ctx.warning(
                "accelerator",
                "trainer.accelerator=gpu but this machine has no GPU; the job fails unless it runs elsewhere",
                "trainer.accelerator=auto",
                check="gpu-available",
            )
