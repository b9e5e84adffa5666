"""Applying FSDP2 to a model from outside it (imported only when building)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytorch_lightning as pl
import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from blocks.precision.base import PrecisionBlock
    from blocks.strategy.fsdp import FSDP

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def mixed_precision_policy(strategy: FSDP, precision: PrecisionBlock) -> MixedPrecisionPolicy:
    """The FSDP2 policy for a precision block: compute dtype for parameters, float32 reductions.

    Precisions that are not mixed get the default policy (no casting): their dtype is the
    parameters' own. The dtype is :meth:`~blocks.strategy.fsdp.FSDP.forward_parameter_dtype`'s,
    the one ``blocks eval`` scores such a run in.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = strategy.forward_parameter_dtype(precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=_DTYPES[dtype], reduce_dtype=torch.float32)


def fsdp_parallelizer(
    strategy: FSDP, precision: PrecisionBlock, units: str
) -> Callable[[nn.Module, DeviceMesh], None]:
    """A function that shards ``model.<units>`` one by one, then the root, on a data-parallel mesh."""

    def parallelize(model: nn.Module, mesh: DeviceMesh) -> None:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        layers = getattr(model, units)
        if not isinstance(layers, nn.ModuleList):
            raise TypeError(f"model.{units} must be an nn.ModuleList to be sharded unit by unit")
        if strategy.activation_checkpointing:
            from blocks.compat.torch_private import activation_checkpointed

            for index, layer in enumerate(layers):
                layers[index] = activation_checkpointed(layer)
        data_parallel = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
        policy = mixed_precision_policy(strategy, precision)
        offload = CPUOffloadPolicy() if strategy.cpu_offload else OffloadPolicy()
        for layer in layers:
            fully_shard(
                layer,
                mesh=data_parallel,
                reshard_after_forward=strategy.reshard_after_forward,
                mp_policy=policy,
                offload_policy=offload,
            )
        fully_shard(
            model, mesh=data_parallel, reshard_after_forward=False, mp_policy=policy, offload_policy=offload
        )

    return parallelize


class DeferGradientSync(pl.Callback):
    """FSDP2 reduce-scatters only on the last micro-batch of each optimizer step.

    Lightning's automatic optimization skips gradient sync during accumulation only for DDP;
    for FSDP2 modules this callback sets ``set_requires_gradient_sync`` per micro-batch.
    """

    def __init__(self, accumulate: int) -> None:
        self.accumulate = accumulate

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Sync gradients only when this micro-batch completes an optimizer step."""
        from torch.distributed.fsdp import FSDPModule

        last = (batch_idx + 1) % self.accumulate == 0
        for module in pl_module.modules():
            if isinstance(module, FSDPModule):
                module.set_requires_gradient_sync(last, recurse=False)
