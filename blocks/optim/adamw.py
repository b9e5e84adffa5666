"""``optim=adamw`` and ``optim=sgd``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from blocks.optim.base import OptimBlock
from blocks.spec.registry import register

if TYPE_CHECKING:
    import torch

    from blocks.core.plan import CheckContext


def fused_conflict(ctx: CheckContext) -> bool:
    """Whether Lightning's mixed-precision plugin would clip the gradients: it refuses to for a fused optimizer."""
    precision = ctx.block("strategy").lightning_precision(ctx.block("precision"))  # type: ignore[attr-defined]
    return str(precision).endswith("-mixed") and ctx.optim.grad_clip is not None


def check_fused(ctx: CheckContext, fused: bool | None) -> None:
    """``fused=true`` with gradient clipping under ``*-mixed`` precision: an error naming both ways out."""
    if fused and fused_conflict(ctx):
        ctx.error(
            "fused",
            "Lightning's mixed-precision plugin cannot clip the gradients of a fused optimizer "
            "(it unscales them inside its step)",
            "optim.fused=null (fused wherever it works) or optim.grad_clip=null",
            check="fused-clipping",
            related=("optim.grad_clip", "precision"),
        )


@register("adamw")
@dataclass(frozen=True, kw_only=True)
class AdamW(OptimBlock):
    """AdamW with warmup and a decay schedule.

    Attributes:
        beta1: first-moment decay.
        beta2: second-moment decay.
        eps: denominator epsilon.
        fused: torch's fused kernel (one kernel updates every parameter: much less per-step
            work on a small model, and ``monitor.on_nonfinite=skip`` skips a bad step on the
            device without a host sync). null: fused wherever every parameter allows it
            (floating point, on a CPU or CUDA device, not sharded by FSDP), except with
            gradient clipping under ``*-mixed`` precision, where Lightning refuses it.
    """

    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    fused: bool | None = None

    def make_optimizer(self, groups: list[dict]) -> torch.optim.Optimizer:
        """``torch.optim.AdamW``."""
        import torch

        from blocks.optim.factory import use_fused

        return torch.optim.AdamW(
            groups,
            lr=self.lr,
            betas=(self.beta1, self.beta2),
            eps=self.eps,
            fused=use_fused(self.fused, groups),
        )

    def check(self, ctx: CheckContext) -> None:
        """Betas in [0, 1)."""
        super().check(ctx)
        for name in ("beta1", "beta2"):
            ctx.within(name, getattr(self, name), 0, 1)
        ctx.positive("eps", self.eps)
        check_fused(ctx, self.fused)


@register("sgd")
@dataclass(frozen=True, kw_only=True)
class SGD(OptimBlock):
    """Stochastic gradient descent with momentum, warmup and a decay schedule.

    Attributes:
        momentum: momentum factor (0 disables it).
        nesterov: use Nesterov momentum.
        fused: torch's fused kernel, as for ``optim=adamw`` (null: wherever every parameter
            allows it). ``monitor.on_nonfinite=skip`` still checks each step on the host with SGD.
    """

    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    fused: bool | None = None

    def state_per_parameter(self) -> int:
        """One momentum buffer, or none without momentum."""
        return 1 if self.momentum else 0

    def make_optimizer(self, groups: list[dict]) -> torch.optim.Optimizer:
        """``torch.optim.SGD``."""
        import torch

        from blocks.optim.factory import use_fused

        return torch.optim.SGD(
            groups,
            lr=self.lr,
            momentum=self.momentum,
            nesterov=self.nesterov,
            fused=use_fused(self.fused, groups),
        )

    def check(self, ctx: CheckContext) -> None:
        """Momentum in [0, 1); Nesterov needs momentum."""
        super().check(ctx)
        ctx.within("momentum", self.momentum, 0, 1)
        check_fused(ctx, self.fused)
        if self.nesterov and self.momentum == 0:
            ctx.error(
                "nesterov",
                "Nesterov momentum needs optim.momentum > 0",
                "optim.momentum=0.9 or optim.nesterov=false",
                check="nesterov-momentum",
            )
