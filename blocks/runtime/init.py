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
        raise BlocksError(
            Problem(
                key,
                f"the weights in {source} do not fit this model ({details})",
                "start from a run of the same model block with the same sizes and data shape",
                check="weights-fit",
            )
        )
    module.load_state_dict(state)


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
