"""The model kind: a network that maps a batch's ``inputs`` to outputs its task scores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.data.base import BatchSpec
from blocks.spec.block import Block

if TYPE_CHECKING:
    from torch import nn

    from blocks.core.plan import CheckContext


@dataclass(frozen=True, kw_only=True)
class ModelBlock(Block):
    """Base of model blocks.

    A model block declares which batch specs it accepts, how many parameters it has for a
    given spec (torch-free, for the plan), and the repeated units that parallelism strategies
    shard and checkpoint (e.g. a transformer's layers).

    Attributes:
        init_from: start from these weights instead of a random init: a ``.safetensors``
            file (e.g. an export), a committed checkpoint directory, or a run dir (its
            ``model.safetensors``, else its newest committed checkpoint). Resuming a run still
            restores its own checkpoint over them.
        freeze: module-name prefixes whose parameters are not trained (e.g. ``[layers.0,
            token_embedding]``; ``0`` is the first layer of an MLP). Each must match a parameter.
    """

    kind: ClassVar[str] = "model"
    accepts: ClassVar[tuple[type, ...]] = ()
    """Batch spec types (``TokenBatch``, ``FeatureBatch``) this model takes."""

    init_from: str | None = None
    freeze: tuple[str, ...] = ()

    def num_parameters(self, spec: BatchSpec) -> int:
        """Parameter count for *spec*, computed without torch."""
        raise NotImplementedError

    def flops_per_sample(self, spec: BatchSpec) -> float | None:
        """Training FLOPs (forward and backward) per sample, for MFU; ``None`` when unknown."""
        return None

    def shard_units(self) -> str | None:
        """Attribute name of the ``nn.ModuleList`` of repeated units, or ``None`` if it has none."""
        return None

    def unit_count(self) -> int:
        """How many :meth:`shard_units` the model has (0 when it declares none or cannot say).

        The plan's sharded memory estimate reads it, whatever the field is called (``n_layers``,
        ``depth``); a model that names shard units should say how many.
        """
        return 0

    def unit_parameters(self, spec: BatchSpec) -> int | None:
        """Parameters of one of the :meth:`shard_units` (FSDP gathers one or two at a time), or None."""
        return None

    def activation_elements(self, spec: BatchSpec, micro_batch: int, *, checkpointing: bool) -> int | None:
        """Elements of the activations one micro-batch keeps for backward (torch-free), or None if unknown.

        The plan multiplies this by the compute dtype's size for its memory estimate. With
        *checkpointing*, each unit keeps only its input, and one unit's activations exist at a
        time while it is recomputed. Include the loss's largest buffers (e.g. the logits).
        """
        return None

    def build(self, spec: BatchSpec) -> nn.Module:
        """The ``nn.Module`` for *spec*; imports torch lazily."""
        raise NotImplementedError

    def check(self, ctx: CheckContext) -> None:
        """The data's batch spec must be one this model accepts; freeze prefixes are names."""
        for prefix in self.freeze:
            if not str(prefix).strip(". "):
                ctx.error(
                    "freeze",
                    f"an empty module-name prefix freezes nothing: {list(self.freeze)}",
                    "model.freeze=[0]",
                    check="freeze-prefix",
                )
        if self.init_from is not None and not self.init_from.strip():
            ctx.error(
                "init_from",
                "is empty",
                "model.init_from=null, or a run dir, checkpoint or .safetensors file",
                check="weights-source",
            )
        spec = ctx.batch_spec
        if spec is not None and self.accepts and not isinstance(spec, self.accepts):
            wanted = " or ".join(t.__name__ for t in self.accepts)
            ctx.error(
                "",
                f"model={self.block_name} takes {wanted} batches but data={ctx.data.block_name} "
                f"yields {type(spec).__name__}",
                "choose a data block that yields " + wanted + " or a model that takes " + type(spec).__name__,
                check="data-model-batch",
                related=("data",),
            )
