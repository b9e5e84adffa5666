"""The trainer settings: how long to train, on what hardware, with which seed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from blocks.spec.block import Block
from blocks.spec.registry import register
from blocks.trainer.callbacks import callback_paths, check_callbacks

if TYPE_CHECKING:
    from blocks.spec.imports import Kind

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext

ACCELERATORS = ("auto", "cpu", "gpu")
LAUNCHERS = ("torchrun", "ray")
CLIP_ALGORITHMS = ("norm", "value")
PROFILERS = ("", "simple", "advanced", "pytorch")


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
        shutdown_grace_s: seconds a worker gets to save and exit after SIGTERM or Ctrl-C (a
            preemption, or torchrun stopping the survivors of a failed worker); one still
            running then ends itself, and torchrun (``--shutdown-timeout``) or the Ray driver
            kills one that cannot. Raise it when the checkpoint taken on SIGTERM needs longer
            to write; lower it to restart sooner after a rank hangs.
        launcher: what starts the workers: ``torchrun`` (one ``blocks run`` per node) or
            ``ray`` (every node's workers as actors on the Ray cluster at ``$RAY_ADDRESS``, or
            on a local Ray instance; needs ``pip install 'blocks[ray]'``).
        deterministic: make torch use deterministic algorithms (slower on GPU).
        device_memory_gb: memory of one device in GiB, for the plan's memory estimate; null
            detects it on the planning machine (GPU memory with ``nvidia-smi``, or the host's
            memory shared by ``devices`` on CPU), which may not be the machine that trains.
        overfit_batches: train and validate on only the first N global batches of the
            training split (a debugging check that the model can memorize them); 0 disables.
            An epoch is then a pass over those N batches: the plan's ``steps_per_epoch`` and
            ``total_steps`` count with it.
        limit_train_batches: optimizer steps (global batches) per epoch; null: the whole
            training split. The plan's ``steps_per_epoch`` and ``total_steps`` count with it.
        limit_val_batches: validation batches per process at each validation; null: the whole
            validation split, 0: no validation.
        gradient_clip_algorithm: how ``optim.grad_clip`` clips: ``norm`` (the global gradient
            norm) or ``value`` (each gradient element).
        profiler: Lightning's profiler: ``simple``, ``advanced`` or ``pytorch``; its report is
            written into the run dir (empty: none).
        detect_anomaly: torch's anomaly detection: a NaN in backward fails the step with the
            operation that made it (slow; for debugging).
        callbacks: Lightning callbacks, each ``{_target_: <import path of a Callback class>,
            <argument>: <value>}``, e.g. ``{_target_: pytorch_lightning.callbacks.EarlyStopping,
            monitor: val/loss, patience: 3}``. Metric arguments (``monitor``) take blocks' metric
            names. Lightning's callbacks need no permission; others follow the import allow-list.
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
    shutdown_grace_s: int = 30
    launcher: str = "torchrun"
    deterministic: bool = False
    device_memory_gb: float | None = None
    overfit_batches: int = 0
    limit_train_batches: int | None = None
    limit_val_batches: int | None = None
    gradient_clip_algorithm: str = "norm"
    profiler: str = ""
    detect_anomaly: bool = False
    callbacks: list[Any] = field(default_factory=list)

    def import_paths(self) -> list[tuple[str, str, Kind]]:
        """The callback classes of ``callbacks`` and the nested ``_target_`` of their arguments."""
        return callback_paths(list(self.callbacks))


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
        ctx.positive("shutdown_grace_s", self.shutdown_grace_s)
        ctx.positive("device_memory_gb", self.device_memory_gb)
        ctx.positive("overfit_batches", self.overfit_batches, allow_zero=True)
        ctx.positive("limit_train_batches", self.limit_train_batches)
        ctx.positive("limit_val_batches", self.limit_val_batches, allow_zero=True)
        ctx.choice("gradient_clip_algorithm", self.gradient_clip_algorithm, CLIP_ALGORITHMS)
        ctx.choice("profiler", self.profiler, PROFILERS)
        self._check_knobs(ctx)
        check_callbacks(ctx, list(self.callbacks))
        if not 0 <= self.seed <= MAX_SEED:
            ctx.error(
                "seed",
                f"must be in [0, {MAX_SEED}] (seeds are unsigned 32-bit), got {self.seed}",
                f"trainer.seed={self.seed % (MAX_SEED + 1)}",
                check="range",
            )
        ctx.choice("accelerator", self.accelerator, ACCELERATORS)
        ctx.choice("launcher", self.launcher, LAUNCHERS)
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

    def _check_knobs(self, ctx: CheckContext) -> None:
        """Combinations of the debugging and clipping knobs that cannot work together."""
        if self.overfit_batches and self.limit_train_batches is not None:
            ctx.error(
                "limit_train_batches",
                "trainer.overfit_batches already chooses the batches to train on; the two cannot combine",
                "remove trainer.limit_train_batches (or set trainer.overfit_batches=0)",
                check="limit-overfit",
                related=("trainer.overfit_batches",),
            )
        if self.gradient_clip_algorithm == "value":
            if not ctx.optim.grad_clip:
                ctx.error(
                    "gradient_clip_algorithm",
                    "clips by value, but optim.grad_clip (the value to clip at) is not set",
                    "optim.grad_clip=1.0",
                    check="clip-algorithm",
                    related=("optim.grad_clip",),
                )
            if ctx.block("strategy").block_name == "fsdp":
                ctx.error(
                    "gradient_clip_algorithm",
                    "strategy=fsdp clips only by the gradient norm (Lightning's FSDP refuses value clipping)",
                    "trainer.gradient_clip_algorithm=norm",
                    check="clip-algorithm-strategy",
                    related=("strategy",),
                )
        if self.detect_anomaly and ctx.monitor.on_nonfinite != "stop":
            ctx.error(
                "detect_anomaly",
                "anomaly detection fails the step at the first NaN in backward, so "
                "monitor.on_nonfinite's skip or rollback never runs",
                "monitor.on_nonfinite=stop (or trainer.detect_anomaly=false)",
                check="anomaly-nonfinite",
                related=("monitor.on_nonfinite",),
            )
        if self.limit_val_batches == 0 and _split_size(ctx, "val"):
            ctx.warning(
                "limit_val_batches",
                "0 turns validation off: no val/ metric is logged",
                "remove trainer.limit_val_batches",
                check="limit-val-off",
            )


def _split_size(ctx: CheckContext, split: str) -> int:
    """The samples of the data block's *split* (0 when unknown)."""
    try:
        return int(ctx.block("data").num_samples(split))  # type: ignore[attr-defined]
    except Exception:
        return 0
