"""Pipelines: a recipe that chains stages (train, evaluate, export), each taking an earlier stage's result.

A recipe function may return a :class:`Pipeline` instead of a :class:`~blocks.core.recipe.Recipe`.
``blocks run recipe=NAME`` then runs the stages in order, each in its own run dir under the
pipeline's, skips the stages whose results already exist, and resumes the interrupted one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from blocks.spec.errors import RegistryError
from blocks.spec.kinds import GROUPS

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
RESERVED = frozenset({*GROUPS, "hydra"})


@dataclass(frozen=True)
class Train:
    """A training stage: one job composed from Hydra overrides (usually ``recipe=NAME``).

    Attributes:
        name: the stage's name and its run dir under the pipeline's.
        overrides: Hydra overrides of the job, e.g. ``("recipe=digits_mlp", "trainer.max_steps=100")``.
        init_from: an earlier train stage whose final weights start this model (``model.init_from``).
    """

    name: str
    overrides: tuple[str, ...] = ()
    init_from: str | None = None


@dataclass(frozen=True)
class Evaluate:
    """An evaluation stage: ``blocks eval`` of an earlier train stage; writes ``metrics.json``.

    Attributes:
        name: the stage's name and its directory under the pipeline's.
        source: the train stage whose model is scored.
        overrides: ``data=NAME`` or ``data.KEY=VALUE`` changes to the source's data block.
        split: the split to score.
    """

    name: str
    source: str
    overrides: tuple[str, ...] = ()
    split: str = "val"


@dataclass(frozen=True)
class Export:
    """An export stage: ``blocks export`` of an earlier train stage into ``<stage dir>/model``.

    Attributes:
        name: the stage's name and its directory under the pipeline's.
        source: the train stage whose model is exported.
    """

    name: str
    source: str


Stage = Train | Evaluate | Export


@dataclass(frozen=True)
class Pipeline:
    """Stages run in order; each refers to earlier stages by name.

    Attributes:
        stages: the stages, first to last.
    """

    stages: tuple[Stage, ...]

    def __post_init__(self) -> None:
        seen: dict[str, Stage] = {}
        for stage in self.stages:
            if not _NAME.match(stage.name) or stage.name in RESERVED:
                raise RegistryError(
                    f"pipeline stage name '{stage.name}' must be lower_snake_case and not one of "
                    f"{', '.join(sorted(RESERVED))} (it prefixes the stage's overrides)"
                )
            if stage.name in seen:
                raise RegistryError(f"pipeline stage '{stage.name}' appears twice")
            ref = stage.init_from if isinstance(stage, Train) else stage.source
            if ref is not None and not isinstance(seen.get(ref), Train):
                field = "init_from" if isinstance(stage, Train) else "source"
                earlier = [n for n, s in seen.items() if isinstance(s, Train)]
                raise RegistryError(
                    f"pipeline stage '{stage.name}' has {field}='{ref}', which is not an earlier train stage "
                    f"(earlier train stages: {', '.join(earlier) or 'none'})"
                )
            seen[stage.name] = stage

    def stage(self, name: str) -> Stage:
        """The stage called *name*."""
        return next(s for s in self.stages if s.name == name)
