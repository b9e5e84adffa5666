"""Building torch optimizers and LR schedulers from optim blocks (imported only when building)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch.optim.lr_scheduler import LambdaLR

from blocks.optim.schedule import lr_factor

if TYPE_CHECKING:
    from blocks.optim.base import OptimBlock


def parameter_groups(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]], weight_decay: float
) -> list[dict]:
    """Two groups: matrices (decayed) and everything 1-d (biases, norms; not decayed)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for _, param in named_parameters:
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


FUSED_DEVICES = ("cpu", "cuda")
"""Device types with fused optimizer kernels this project relies on (torch has them for a few more)."""


def use_fused(fused: bool | None, groups: list[dict]) -> bool:
    """*fused* when set; else whether every parameter in *groups* can use torch's fused optimizer kernels.

    Fused kernels need floating-point tensors on a supported device; parameters that FSDP
    shards (DTensors) keep torch's default implementation.
    """
    if fused is not None:
        return fused
    from torch.distributed.tensor import DTensor

    params = [p for group in groups for p in group["params"]]
    return bool(params) and all(
        p.device.type in FUSED_DEVICES and p.is_floating_point() and not isinstance(p, DTensor)
        for p in params
    )


def build_optimizer(
    block: OptimBlock, named_parameters: Iterable[tuple[str, torch.nn.Parameter]], total_steps: int
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """The block's optimizer with a per-step ``LambdaLR`` following its schedule."""
    optimizer = block.make_optimizer(parameter_groups(named_parameters, block.weight_decay))
    factor = functools.partial(
        lr_factor,
        warmup_steps=block.warmup_steps,
        total_steps=total_steps,
        schedule=block.schedule,
        min_lr_ratio=block.min_lr_ratio,
    )
    return optimizer, LambdaLR(optimizer, factor)
