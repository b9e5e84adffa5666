"""The kind table: every block kind spelled once (name, base class, default option, doc).

The recipe type, the Hydra defaults list, the catalog, the docs reference and the pipeline's
reserved stage names are derived from :data:`KIND_TABLE`; adding a kind is one entry here and
the kind's own package. Base classes are named by import path so that this table, like the
rest of the spec base, imports no kind.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blocks.spec.block import Block

MUST_CHOOSE = "???"
"""The default option of a kind every recipe must choose (Hydra's missing value)."""


@dataclass(frozen=True)
class BlockKind:
    """One block kind: a Hydra config group, a base class and a place in the plan.

    Attributes:
        name: the config group and plan key (``model``).
        base: the kind's base class as ``module:ClassName``; imported only when asked for.
        default: the option chosen when a recipe names none (``MUST_CHOOSE`` when it must).
        doc: one line on what blocks of this kind decide.
    """

    name: str
    base: str
    default: str
    doc: str

    @property
    def package(self) -> str:
        """The package whose import registers the built-in blocks of this kind."""
        return self.base.split(":")[0].rsplit(".", 1)[0]

    def base_class(self) -> type[Block]:
        """The kind's base class (imports the kind's package)."""
        module, _, name = self.base.partition(":")
        cls: type[Block] = getattr(importlib.import_module(module), name)
        return cls


KIND_TABLE: tuple[BlockKind, ...] = (
    BlockKind(
        "data",
        "blocks.data.base:DataBlock",
        MUST_CHOOSE,
        "where samples come from, and the batch contract (`TokenBatch` or `FeatureBatch`)",
    ),
    BlockKind(
        "model",
        "blocks.model.base:ModelBlock",
        MUST_CHOOSE,
        "the network; declares which batch specs it accepts",
    ),
    BlockKind(
        "task",
        "blocks.task.base:TaskBlock",
        MUST_CHOOSE,
        "the loss and the validation metrics; declares which batch specs it scores",
    ),
    BlockKind(
        "optim",
        "blocks.optim.base:OptimBlock",
        "adamw",
        "optimizer, LR schedule, gradient accumulation and clipping",
    ),
    BlockKind(
        "strategy",
        "blocks.strategy.base:StrategyBlock",
        "single",
        "how training is spread over processes and devices",
    ),
    BlockKind(
        "precision",
        "blocks.precision.base:PrecisionBlock",
        "32-true",
        "numeric formats for parameters and computation",
    ),
    BlockKind(
        "checkpoint",
        "blocks.checkpoint.base:CheckpointBlock",
        "default",
        "where and when training state is saved, and what a run resumes from",
    ),
    BlockKind(
        "monitor",
        "blocks.monitor.base:MonitorBlock",
        "default",
        "what a run reports while it trains, and how often",
    ),
    BlockKind(
        "trainer",
        "blocks.trainer.base:TrainerBlock",
        "default",
        "length of training, hardware, seed, validation cadence",
    ),
)
"""Every block kind, in the order the plan shows them."""

KINDS: tuple[str, ...] = tuple(kind.name for kind in KIND_TABLE)
"""Every block kind's name, in the order the plan shows them. Each is a Hydra config group."""

BY_NAME: dict[str, BlockKind] = {kind.name: kind for kind in KIND_TABLE}
"""The kind table by name."""

CROSS_KIND_GROUPS: tuple[str, ...] = ("recipe", "hparams_search", "experiment", "debug")
"""The config groups that choose values across kinds (a recipe, a search, an experiment, a debug preset).

In the primary config's defaults in this order: a later group's values win, and a preset can
choose (``override /<group>``) only the groups listed before its own, as Hydra reads the list
from its end. So an experiment can choose a recipe and a search and set values over both, and a
debug preset applies on top of everything.
"""

GROUPS: tuple[str, ...] = (*KINDS, *CROSS_KIND_GROUPS)
"""Every config group: the kinds, then the cross-kind groups."""
