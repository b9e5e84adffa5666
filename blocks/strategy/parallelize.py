"""Applying FSDP2 to a model from outside it (imported only when building)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytorch_lightning as pl
import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from blocks.precision.base import PrecisionBlock
    from blocks.strategy.base import StrategyBlock
    from blocks.strategy.fsdp import FSDP

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def mixed_precision_policy(strategy: StrategyBlock, precision: PrecisionBlock) -> MixedPrecisionPolicy:
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


def shard_unit_list(model: nn.Module, units: str) -> nn.ModuleList:
    """``model.<units>``, the repeated layers FSDP shards one by one."""
    layers = getattr(model, units)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"model.{units} must be an nn.ModuleList to be sharded unit by unit")
    return layers


def fsdp_units(model: nn.Module, units: str | None) -> list[nn.Module]:
    """The modules ``fully_shard`` applies to, in order: each of ``model.<units>`` (if any), then the root *model*."""
    return [*(shard_unit_list(model, units) if units else ()), model]


@contextlib.contextmanager
def policy_without_sharding(
    model: nn.Module, units: str | None, policy: MixedPrecisionPolicy
) -> Iterator[None]:
    """*model* computing on one process as under ``fully_shard`` with *policy* on its :func:`fsdp_units`.

    The parameters are cast to ``param_dtype`` in place and stay so; buffers keep their dtype,
    as under FSDP. Inside, each unit casts its floating forward inputs to ``param_dtype``
    (``cast_forward_inputs``) and its floating outputs to ``output_dtype``, as FSDP's hooks do.
    """
    if policy.param_dtype is not None:
        for parameter in model.parameters():
            parameter.data = parameter.data.to(policy.param_dtype)
    handles = []
    for unit in fsdp_units(model, units):
        if policy.cast_forward_inputs and policy.param_dtype is not None:
            cast = functools.partial(_cast_inputs, policy.param_dtype)
            handles.append(unit.register_forward_pre_hook(cast, prepend=True, with_kwargs=True))
        if policy.output_dtype is not None:
            handles.append(unit.register_forward_hook(functools.partial(_cast_output, policy.output_dtype)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _cast_inputs(
    dtype: torch.dtype, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, Any]:
    from blocks.compat.torch_private import cast_floating_tensors

    return cast_floating_tensors(dtype, args), cast_floating_tensors(dtype, kwargs)


def _cast_output(dtype: torch.dtype, module: nn.Module, args: Any, output: Any) -> Any:
    from blocks.compat.torch_private import cast_floating_tensors

    return cast_floating_tensors(dtype, output)


def fsdp_parallelizer(
    strategy: FSDP, precision: PrecisionBlock, units: str
) -> Callable[[nn.Module, DeviceMesh], None]:
    """A function that shards ``model.<units>`` one by one, then the root, on a data-parallel mesh.

    Its ``compile_mode`` (None: eager) compiles each unit's forward before sharding it, after
    wrapping it for activation checkpointing (torchtitan's order: the recomputed forward is in
    the graph, FSDP2's hooks stay outside it). The root is not compiled: its forward calls the
    units, whose FSDP2 hooks dynamo cannot trace.
    """

    def parallelize(model: nn.Module, mesh: DeviceMesh, compile_mode: str | None = None) -> None:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        layers = shard_unit_list(model, units)
        if strategy.activation_checkpointing:
            from blocks.compat.torch_private import activation_checkpointed

            for index, layer in enumerate(layers):
                layers[index] = activation_checkpointed(layer)
        if compile_mode is not None:
            from blocks.compat.torch_private import compile_forwards_in_place

            compile_forwards_in_place(layers, mode=compile_mode)
        data_parallel = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
        policy = mixed_precision_policy(strategy, precision)
        offload = CPUOffloadPolicy() if strategy.cpu_offload else OffloadPolicy()
        *sharded_units, root = fsdp_units(model, units)
        for unit in sharded_units:
            fully_shard(
                unit,
                mesh=data_parallel,
                reshard_after_forward=strategy.reshard_after_forward,
                mp_policy=policy,
                offload_policy=offload,
            )
        fully_shard(
            root, mesh=data_parallel, reshard_after_forward=False, mp_policy=policy, offload_policy=offload
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
