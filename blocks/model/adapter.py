"""``model=torch_module``: an existing ``torch.nn.Module`` class (a LightningModule too) as a model block.

Teams adopt ``blocks`` one piece at a time: their network stays where it is and the config
names its class. The import path must be inside a prefix the user allows in their own settings
(see :mod:`blocks.spec.imports`); the plan checks it without importing anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING

from blocks.data.base import BatchSpec, FeatureBatch, TokenBatch
from blocks.model.base import ModelBlock
from blocks.spec.imports import Kind, check_import_paths, instantiate, nested_paths, resolve, subclass_of
from blocks.spec.registry import register

if TYPE_CHECKING:
    from torch import nn

    from blocks.core.plan import CheckContext


IGNORED_LIGHTNING_METHODS = (
    "training_step",
    "validation_step",
    "test_step",
    "predict_step",
    "configure_optimizers",
    "configure_callbacks",
)
"""What a LightningModule may define that ``model=torch_module`` would not run (it uses ``forward``)."""


def ignored_lightning_methods(cls: type) -> list[str]:
    """The methods of :data:`IGNORED_LIGHTNING_METHODS` that LightningModule class *cls* defines itself."""
    mro = cls.__mro__
    base = next(
        (i for i, c in enumerate(mro) if c.__name__ == "LightningModule" and "lightning" in c.__module__),
        None,
    )
    if base is None:
        return []
    own = mro[:base]
    return [name for name in IGNORED_LIGHTNING_METHODS if any(name in vars(c) for c in own)]


def _refuse_lightning_steps(cls: type) -> tuple[str, str] | None:
    """Refuse a LightningModule whose own steps would be silently replaced by the task and optim blocks."""
    ignored = ignored_lightning_methods(cls)
    if not ignored:
        return None
    return (
        f"is a LightningModule that defines {', '.join(ignored)}; model=torch_module uses only its "
        "forward (the task block computes the loss and metrics, the optim block makes the optimizer), "
        "so these would be ignored",
        "name the nn.Module it wraps (its forward maps inputs to logits), or a subclass that keeps only "
        "forward; move the loss into task=... and the optimizer into optim=...",
    )


MODULE_CLASS = Kind(
    "a torch.nn.Module class", subclass_of("torch.nn.Module"), refuses=_refuse_lightning_steps
)
"""What ``model.target`` must name: a LightningModule only when blocks would not ignore its own steps."""


@register("torch_module")
@dataclass(frozen=True, kw_only=True)
class TorchModule(ModelBlock):
    """An existing ``nn.Module`` class, named by import path.

    Its ``forward`` maps the batch's ``inputs`` to what the task scores (logits); the task and
    optim blocks compute the loss and make the optimizer. A LightningModule that defines its
    own ``training_step``, ``validation_step``, ``configure_optimizers``, ... is refused
    (before anything starts) rather than having them silently ignored.

    Attributes:
        target: import path of the class, e.g. ``mylab.nets.ResNet`` (its module prefix must be allowed).
        kwargs: constructor arguments; a nested ``{_target_: ...}`` builds an object (allowed prefixes only).
        spec_args: constructor arguments taken from the data's batch spec, e.g. ``{in_features: num_features}``.
        shard: attribute of the module's ``nn.ModuleList`` of repeated units, for FSDP (empty: none).
    """

    accepts = (FeatureBatch, TokenBatch)

    target: str = MISSING
    kwargs: dict[str, Any] = field(default_factory=dict)
    spec_args: dict[str, str] = field(default_factory=dict)
    shard: str = ""

    def num_parameters(self, spec: BatchSpec) -> int:
        """Unknown until the class is built (the plan does not import it)."""
        raise ValueError("an adapted module's size is known only once built")

    def shard_units(self) -> str | None:
        """The ``shard`` attribute, if given."""
        return self.shard or None

    def import_paths(self) -> list[tuple[str, str, Kind]]:
        """The class (an ``nn.Module``) and every nested ``_target_`` (a class)."""
        return [("model.target", self.target, MODULE_CLASS), *nested_paths(self.kwargs, "model.kwargs")]

    def constructor_args(self, spec: BatchSpec) -> dict[str, Any]:
        """``kwargs`` (objects built) plus the ``spec_args`` read from *spec*."""
        args = dict(instantiate(dict(self.kwargs), "model.kwargs"))
        args.update({name: getattr(spec, attr) for name, attr in self.spec_args.items()})
        return args

    def build(self, spec: BatchSpec) -> nn.Module:
        """Import the class (checked to be an ``nn.Module`` class), then construct it."""
        cls = resolve(self.target, "model.target", kind=MODULE_CLASS)
        module: nn.Module = cls(**self.constructor_args(spec))
        return module

    def check(self, ctx: CheckContext) -> None:
        """The import path must be allowed; ``spec_args`` must name fields of the batch spec."""
        super().check(ctx)
        check_import_paths(ctx, "model", self.target, self.kwargs)
        spec = ctx.batch_spec
        if spec is not None:
            known = [f.name for f in dataclasses.fields(spec)]
            for name, attr in self.spec_args.items():
                if attr not in known:
                    ctx.error(
                        f"model.spec_args.{name}",
                        f"'{attr}' is not a field of the data's {type(spec).__name__}",
                        f"one of: {', '.join(known)}",
                        check="spec-args",
                    )
