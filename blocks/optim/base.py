"""The optim kind: optimizer, learning-rate schedule, gradient accumulation and clipping."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.optim.schedule import SCHEDULES
from blocks.spec.block import Block

LR_SCALING = ("none", "linear", "sqrt")

if TYPE_CHECKING:
    import torch

    from blocks.core.plan import CheckContext


@dataclass(frozen=True, kw_only=True)
class OptimBlock(Block):
    """Base of optimizer blocks; holds everything about one optimizer step.

    Attributes:
        lr: peak learning rate, reached after warmup.
        weight_decay: decoupled weight decay, applied to weight matrices only (not to
            biases, norms or embeddings' 1-d parameters).
        accumulate: micro-batches per optimizer step; their gradients are averaged. Means
            the same under every strategy.
        global_batch: samples per optimizer step; when set, ``accumulate`` is derived from it
            (``global_batch / (data.batch_size × world size)``), which must divide evenly.
        warmup_steps: optimizer steps of linear warmup.
        schedule: decay after warmup: cosine, linear or constant.
        min_lr_ratio: the LR at the end of the decay as a fraction of ``lr``.
        grad_clip: clip the global gradient norm (or each element, with
            ``trainer.gradient_clip_algorithm=value``) to this value; null disables clipping.
        lr_scaling: scale ``lr`` with the global batch: ``none``, ``linear``
            (``lr × global batch / reference_batch``) or ``sqrt`` (``lr × √(global batch /
            reference_batch)``). The plan shows the result as the effective LR, and the
            optimizer uses it.
        reference_batch: the global batch ``lr`` was tuned for (used by ``lr_scaling``).
    """

    kind: ClassVar[str] = "optim"

    lr: float = 1e-3
    weight_decay: float = 0.0
    accumulate: int = 1
    global_batch: int | None = None
    warmup_steps: int = 0
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0
    lr_scaling: str = "none"
    reference_batch: int = 256

    def state_per_parameter(self) -> int:
        """Optimizer state values kept per parameter (Adam's two moments: 2), for the memory estimate."""
        return 2

    def effective_lr(self, global_batch: int) -> float:
        """The peak LR after ``lr_scaling`` for *global_batch* samples per step."""
        if self.lr_scaling not in ("linear", "sqrt") or global_batch <= 0 or self.reference_batch <= 0:
            return self.lr
        ratio = global_batch / self.reference_batch
        return self.lr * (ratio if self.lr_scaling == "linear" else math.sqrt(ratio))

    def make_optimizer(self, groups: list[dict]) -> torch.optim.Optimizer:
        """The torch optimizer over parameter *groups* (decayed and not decayed)."""
        raise NotImplementedError

    def build(
        self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]], total_steps: int
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        """The optimizer and its per-step LR scheduler."""
        from blocks.optim.factory import build_optimizer

        return build_optimizer(self, named_parameters, total_steps)

    def check(self, ctx: CheckContext) -> None:
        """Positive LR and accumulation, known schedule, warmup shorter than training."""
        ctx.positive("lr", self.lr)
        ctx.positive("weight_decay", self.weight_decay, allow_zero=True)
        ctx.positive("accumulate", self.accumulate)
        ctx.positive("global_batch", self.global_batch)
        if self.global_batch:
            self._check_global_batch(ctx)
        ctx.positive("warmup_steps", self.warmup_steps, allow_zero=True)
        ctx.choice("schedule", self.schedule, SCHEDULES)
        ctx.within("min_lr_ratio", self.min_lr_ratio, 0, 1, high_open=False)
        if self.grad_clip is not None and self.grad_clip <= 0:
            ctx.error(
                "grad_clip",
                f"must be > 0, got {self.grad_clip}; a clip of 0 would zero every gradient",
                "optim.grad_clip=null turns clipping off; or set a norm > 0 (e.g. optim.grad_clip=1.0)",
                check="range",
            )
        ctx.choice("lr_scaling", self.lr_scaling, LR_SCALING)
        ctx.positive("reference_batch", self.reference_batch)
        total = ctx.derived.total_steps
        if total and self.warmup_steps >= total:
            ctx.warning(
                "warmup_steps",
                f"warmup ({self.warmup_steps} steps) covers all {total} training steps; the LR never reaches optim.lr",
                f"optim.warmup_steps={max(0, total // 10)}",
                check="warmup-shorter-than-training",
                related=("trainer.max_steps", "trainer.max_epochs"),
            )

    def _check_global_batch(self, ctx: CheckContext) -> None:
        """``optim.global_batch`` must be a multiple of one micro-step across the data-parallel ranks."""
        data_batch = ctx.data.batch_size
        world = ctx.derived.data_parallel
        per_micro_step = data_batch * world
        if per_micro_step <= 0 or self.global_batch is None or self.global_batch % per_micro_step == 0:
            if self.accumulate != 1 and per_micro_step > 0:
                ctx.warning(
                    "accumulate",
                    f"optim.accumulate={self.accumulate} is ignored: optim.global_batch={self.global_batch} "
                    f"sets it to {ctx.derived.accumulate}",
                    "set only one of optim.accumulate and optim.global_batch",
                    check="accumulate-or-global-batch",
                    related=("optim.global_batch",),
                )
            return
        below = max(per_micro_step, self.global_batch // per_micro_step * per_micro_step)
        ctx.error(
            "global_batch",
            f"optim.global_batch={self.global_batch} is not a multiple of data.batch_size × data-parallel size "
            f"= {data_batch} × {world} = {per_micro_step}",
            f"optim.global_batch={below} or {below + per_micro_step}, or change data.batch_size",
            check="global-batch-divisible",
            related=("data.batch_size", "trainer.devices", "trainer.nodes"),
        )
