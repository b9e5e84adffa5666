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


MODULE_CLASS = Kind("a torch.nn.Module class", subclass_of("torch.nn.Module"))
"""What ``model.target`` must name."""


@register("torch_module")
@dataclass(frozen=True, kw_only=True)
class TorchModule(ModelBlock):
    """An existing ``nn.Module`` (or ``LightningModule``) class, named by import path.

    Its ``forward`` maps the batch's ``inputs`` to what the task scores (logits); the task and
    optim blocks replace a LightningModule's own ``training_step`` and ``configure_optimizers``.

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
