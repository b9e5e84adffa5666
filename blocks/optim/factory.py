"""Building torch optimizers and LR schedulers from optim blocks (imported only when building)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from blocks.compat.torch_private import set_last_lr
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


SETTING_NAMES = {
    "initial_lr": "effective LR",
    "weight_decay": "optim.weight_decay",
    "betas": "optim.beta1/beta2",
    "eps": "optim.eps",
    "momentum": "optim.momentum",
    "nesterov": "optim.nesterov",
    "fused": "optim.fused",
}
"""The config key (or plan entry) of each torch parameter-group setting, for messages."""


def group_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's settings (LR, weight decay, betas, ...; all but its parameters), for :func:`reapply_settings`."""
    return [
        {key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups
    ]


def reapply_settings(
    optimizer: torch.optim.Optimizer, scheduler: LambdaLR, settings: list[dict[str, Any]]
) -> dict[str, tuple[Any, Any]]:
    """Give a restored *optimizer* and *scheduler* the group *settings* they were built with, at the restored step.

    Loading a checkpoint's optimizer and scheduler state brings back the saving run's settings
    with it: each group's LR, ``initial_lr``, weight decay, betas, eps, momentum, and the
    scheduler's base LRs. These are put back to *settings* (from :func:`group_settings` at
    build time), and each group's LR to what this schedule gives at the restored step, so a
    changed ``optim.lr``, weight decay or schedule length applies from the first resumed step.
    The per-parameter state (Adam's moments, momentum buffers) stays as restored.

    Returns the settings that changed, as ``{name: (restored, built)}``, named as in :data:`SETTING_NAMES`.
    """
    changed: dict[str, tuple[Any, Any]] = {}
    for group, built in zip(optimizer.param_groups, settings, strict=True):
        for key, value in built.items():
            name = SETTING_NAMES.get(key, key)
            if key != "lr" and name not in changed and group.get(key) != value:
                changed[name] = (group.get(key), value)
        group.update(built)
    _place_step_counters(optimizer)
    scheduler.base_lrs = [built["initial_lr"] for built in settings]
    rates = [
        base * factor(scheduler.last_epoch)
        for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    set_last_lr(scheduler, rates)
    return changed


def _place_step_counters(optimizer: torch.optim.Optimizer) -> None:
    """Put each fused or capturable group's step counters on its parameters' device, in float32.

    Where torch's ``load_state_dict`` puts them for such a group; a checkpoint saved with
    ``optim.fused=false`` holds them on the host, where a fused kernel on CUDA cannot read them.
    """
    for group in optimizer.param_groups:
        if group.get("fused") or group.get("capturable"):
            for param in group["params"]:
                state = optimizer.state.get(param, {})
                if isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].to(dtype=torch.float32, device=param.device)
