"""``strategy=fsdp``: shard parameters, gradients and optimizer state with FSDP2 (``fully_shard``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from blocks.spec.registry import register
from blocks.strategy.base import MemoryLayout, StrategyBlock
from blocks.strategy.ddp import check_backend

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext
    from blocks.precision.base import PrecisionBlock


@register("fsdp")
@dataclass(frozen=True, kw_only=True)
class FSDP(StrategyBlock):
    """Fully sharded data parallel (FSDP2) through Lightning's ``ModelParallelStrategy``.

    Checkpoints are torch distributed checkpoint (DCP) shards written through fsspec, so they
    go to ``s3://`` as well and load on another world size.

    ``fully_shard`` is applied from outside the model: to each unit the model block declares
    (the transformer's layers), then to the root. The mixed-precision policy comes from the
    precision block, so there is one precision setting: ``precision=bf16-mixed`` keeps float32
    sharded parameters and computes in bfloat16; ``precision=bf16-true`` stores bfloat16.

    Attributes:
        backend: process-group backend; null picks nccl on GPUs and gloo on CPUs.
        reshard_after_forward: free gathered parameters after each unit's forward (less memory,
            one more all-gather in backward).
        cpu_offload: keep sharded parameters, gradients and optimizer state in CPU memory.
        activation_checkpointing: recompute each unit's activations in backward instead of storing them.
        reduce_every_micro_batch: with ``optim.accumulate > 1``, reduce-scatter gradients after
            every micro-batch (sharded gradients: less memory) instead of only after the last
            (unsharded gradients kept until then: less traffic).
        collective_timeout_s: a collective that waits longer than this fails the job instead of hanging.
    """

    shards_parameters = True

    backend: str | None = None
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    activation_checkpointing: bool = False
    reduce_every_micro_batch: bool = True
    collective_timeout_s: float = 1800.0

    def build(self, *, accelerator: str, precision: PrecisionBlock, world_size: int, io: Any = None) -> Any:
        """Lightning's ``ModelParallelStrategy`` over a one-dimensional data-parallel mesh."""
        from datetime import timedelta

        from blocks.checkpoint.sharded import ShardedCheckpointStrategy
        from blocks.strategy.ddp import backend_for

        return ShardedCheckpointStrategy(
            io=io,
            data_parallel_size=world_size,
            tensor_parallel_size=1,
            process_group_backend=backend_for(accelerator, self.backend),
            timeout=timedelta(seconds=self.collective_timeout_s),
        )

    def parallelizer(self, *, precision: PrecisionBlock, units: str | None) -> Callable[..., None] | None:
        """Shard each of the model's units, then the root."""
        from blocks.strategy.parallelize import fsdp_parallelizer

        assert units is not None, "the plan refuses fsdp on a model without units"
        return fsdp_parallelizer(self, precision, units)

    def callbacks(self, *, accumulate: int) -> list[Any]:
        """With deferred reduction, turn gradient sync off for all but the last micro-batch."""
        if self.reduce_every_micro_batch or accumulate == 1:
            return []
        from blocks.strategy.parallelize import DeferGradientSync

        return [DeferGradientSync(accumulate)]

    def lightning_precision(self, precision: PrecisionBlock) -> str:
        """Mixed precision is FSDP's own policy, so Lightning keeps float32 (no autocast on top)."""
        return "32-true" if precision.lightning.endswith("-mixed") else precision.lightning

    def forward_parameter_dtype(self, precision: PrecisionBlock) -> str | None:
        """Under a mixed precision, FSDP's policy: parameters and floating inputs in the compute dtype."""
        return precision.compute_dtype if precision.lightning.endswith("-mixed") else None

    def memory_layout(self) -> MemoryLayout:
        """Sharded state; activation checkpointing and CPU offload as configured."""
        return MemoryLayout(
            shards_parameters=True,
            activation_checkpointing=self.activation_checkpointing,
            cpu_offload=self.cpu_offload,
        )

    def collective_timeout(self) -> float | None:
        """``collective_timeout_s``."""
        return self.collective_timeout_s

    def check(self, ctx: CheckContext) -> None:
        """The model must declare units; the precision must have an FSDP policy; offloading needs GPUs."""
        super().check(ctx)
        ctx.positive("collective_timeout_s", self.collective_timeout_s)
        check_backend(ctx, self.backend)
        units = ctx.model.shard_units()
        if units is None:
            ctx.error(
                "",
                f"strategy=fsdp shards the units a model declares, and model={ctx.model.block_name} declares none",
                "strategy=ddp for this model, or a model block whose shard_units() names its repeated layers",
                check="fsdp-model-units",
                related=("model",),
            )
        if self.cpu_offload and ctx.derived.accelerator != "gpu":
            ctx.error(
                "cpu_offload",
                "strategy.cpu_offload moves the GPU's parameter shards, gradients and optimizer state "
                f"to host memory, and this job runs on CPUs (trainer.accelerator resolves to "
                f"'{ctx.derived.accelerator}'), whose shards are in host memory already",
                "strategy.cpu_offload=false, or trainer.accelerator=gpu on a machine with GPUs",
                check="fsdp-cpu-offload-accelerator",
                related=("trainer.accelerator",),
            )
        precision = cast("PrecisionBlock", ctx.block("precision"))
        if precision.needs_grad_scaler:
            ctx.error(
                "",
                "strategy=fsdp has no float16 policy with a gradient scaler here",
                "precision=bf16-mixed",
                check="fsdp-precision",
                related=("precision",),
            )
