"""Starting a model from other weights (``model.init_from``) and freezing parts of it (``model.freeze``)."""

from __future__ import annotations

from torch import nn

from blocks.model.base import ModelBlock
from blocks.spec.errors import BlocksError, Problem


def initialize(module: nn.Module, block: ModelBlock) -> None:
    """Load ``block.init_from`` into *module* (names and shapes must match), then freeze ``block.freeze``."""
    if block.init_from:
        from blocks.checkpoint.sources import load_weights

        load_into(module, load_weights(block.init_from), key="model.init_from", source=block.init_from)
    freeze(module, block.freeze)


def load_into(module: nn.Module, state: dict, *, key: str, source: str) -> None:
    """Copy *state* into *module*; a missing, extra or reshaped tensor is an error naming *key*."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    reshaped = sorted(n for n in set(own) & set(state) if tuple(own[n].shape) != tuple(state[n].shape))
    if missing or unexpected or reshaped:
        details = "; ".join(
            f"{label}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
            for label, names in (("missing", missing), ("unexpected", unexpected), ("other shape", reshaped))
            if names
        )
        fix = "start from a run of the same model block with the same sizes and data shape"
        prefix = wrapper_prefix(set(state), set(own))
        if prefix:
            fix = (
                f"every name in {source} starts with '{prefix}' ({_WRAPPERS[prefix.split('.')[0] + '.']}), "
                f"and without it the names are this model's: save the weights with the names stripped "
                f"({{name.removeprefix('{prefix}'): tensor, ...}}, or the unwrapped module's state_dict()) "
                f"and point {key} at that file"
            )
        raise BlocksError(
            Problem(
                key, f"the weights in {source} do not fit this model ({details})", fix, check="weights-fit"
            )
        )
    module.load_state_dict(state)


_WRAPPERS = {
    "_orig_mod.": "saved from a module torch.compile wrapped",
    "module.": "saved from a module DDP or DataParallel wrapped",
}
"""Name prefixes a torch wrapper adds to the weights of the module it wraps, and which wrapper."""


def wrapper_prefix(saved: set[str], own: set[str]) -> str:
    """The wrapper prefix (``_orig_mod.``, ``module.``, nested) on every *saved* name whose removal gives *own*; "" if none."""
    prefix = ""
    names = saved
    while names and names != own:
        added = next((p for p in _WRAPPERS if all(name.startswith(p) for name in names)), None)
        if added is None:
            return ""
        prefix += added
        names = {name.removeprefix(added) for name in names}
    return prefix if names == own else ""


def freeze(module: nn.Module, prefixes: tuple[str, ...] | list[str]) -> list[str]:
    """Stop training every parameter under the module-name *prefixes*; returns the frozen names."""
    frozen = []
    names = [name for name, _ in module.named_parameters()]
    for prefix in prefixes:
        prefix = str(prefix).strip(".")
        matched = [n for n in names if n == prefix or n.startswith(prefix + ".")]
        if not matched:
            top = sorted({n.split(".")[0] for n in names})
            raise BlocksError(
                Problem(
                    "model.freeze",
                    f"'{prefix}' matches no parameter of the model",
                    f"use module-name prefixes such as: {', '.join(top)}",
                    check="freeze-prefix",
                )
            )
        frozen.extend(matched)
    for name, param in module.named_parameters():
        if name in frozen:
            param.requires_grad_(False)
    if names and len(set(frozen)) == len(names):
        raise BlocksError(
            Problem("model.freeze", "freezes every parameter; nothing would train", "freeze fewer modules")
        )
    return frozen
