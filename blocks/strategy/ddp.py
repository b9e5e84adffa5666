"""``strategy=ddp``: replicate the model on every process and all-reduce gradients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blocks.spec.registry import register
from blocks.strategy.base import StrategyBlock

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext
    from blocks.precision.base import PrecisionBlock


def backend_for(accelerator: str, requested: str | None) -> str:
    """The process-group backend: as requested, else NCCL on GPUs and gloo on CPUs."""
    if requested:
        return requested
    return "nccl" if accelerator == "gpu" else "gloo"


@register("ddp")
@dataclass(frozen=True, kw_only=True)
class DDP(StrategyBlock):
    """Distributed data parallel: a full replica per process, gradients averaged by all-reduce.

    With ``optim.accumulate > 1`` the all-reduce is skipped (``no_sync``) until the last
    micro-batch of each optimizer step.

    Attributes:
        backend: process-group backend; null picks nccl on GPUs and gloo on CPUs.
        find_unused_parameters: let DDP handle parameters that get no gradient in a step (slower).
        static_graph: promise the autograd graph is the same every step (enables optimizations).
        bucket_cap_mb: gradient bucket size for overlapping all-reduce with backward.
        gradient_as_bucket_view: gradients are views into the all-reduce buckets (saves memory).
        collective_timeout_s: a collective that waits longer than this fails the job instead of hanging.
    """

    backend: str | None = None
    find_unused_parameters: bool = False
    static_graph: bool = False
    bucket_cap_mb: int = 25
    gradient_as_bucket_view: bool = True
    collective_timeout_s: float = 1800.0

    def build(self, *, accelerator: str, precision: PrecisionBlock, world_size: int, io: Any = None) -> Any:
        """Lightning's ``DDPStrategy``."""
        from datetime import timedelta

        from pytorch_lightning.strategies import DDPStrategy

        return DDPStrategy(
            process_group_backend=backend_for(accelerator, self.backend),
            find_unused_parameters=self.find_unused_parameters,
            static_graph=self.static_graph,
            bucket_cap_mb=self.bucket_cap_mb,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            timeout=timedelta(seconds=self.collective_timeout_s),
            checkpoint_io=io,
        )

    def collective_timeout(self) -> float | None:
        """``collective_timeout_s``."""
        return self.collective_timeout_s

    def check(self, ctx: CheckContext) -> None:
        """Positive sizes; a one-process DDP job is allowed but pointless."""
        super().check(ctx)
        ctx.positive("bucket_cap_mb", self.bucket_cap_mb)
        ctx.positive("collective_timeout_s", self.collective_timeout_s)
        check_backend(ctx, self.backend)
        if ctx.derived.world_size == 1:
            ctx.warning(
                "",
                "strategy=ddp with one process adds overhead and no parallelism",
                "strategy=single, or trainer.devices=N for N processes",
                check="ddp-one-process",
                related=("trainer.devices", "trainer.nodes"),
            )


def check_backend(ctx: CheckContext, backend: str | None) -> None:
    """NCCL needs GPUs; the backend must be one torch knows."""
    if backend is None:
        return
    ctx.choice("backend", backend, ("gloo", "nccl", "mpi"))
    if backend == "nccl" and ctx.derived.accelerator == "cpu":
        ctx.error(
            "backend",
            "nccl runs on GPUs only, but the job runs on CPUs",
            "strategy.backend=null (gloo on CPU) or trainer.accelerator=gpu",
            check="backend-accelerator",
            related=("trainer.accelerator",),
        )
