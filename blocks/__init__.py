"""blocks: compose PyTorch training runs from typed blocks, check them, run them anywhere.

The top-level package is torch-free and imports nothing until a name is used: ``import
blocks.spec.errors`` loads the errors module, not every block kind. The public names below
come from the spec layer (blocks, recipes, the plan); building (Lightning) and launching
(processes) import torch when they are used.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from blocks.core.pipeline import Evaluate, Export, Pipeline, Train
    from blocks.core.plan import Plan, make_plan
    from blocks.core.recipe import Recipe, derive, recipe
    from blocks.spec.block import Block
    from blocks.spec.errors import BlocksError, ConfigError, PlanError, Problem
    from blocks.spec.kinds import KINDS
    from blocks.spec.registry import register

__version__ = "0.1.0"

_EXPORTS = {
    "KINDS": "blocks.spec.kinds",
    "Block": "blocks.spec.block",
    "BlocksError": "blocks.spec.errors",
    "ConfigError": "blocks.spec.errors",
    "PlanError": "blocks.spec.errors",
    "Problem": "blocks.spec.errors",
    "Evaluate": "blocks.core.pipeline",
    "Export": "blocks.core.pipeline",
    "Pipeline": "blocks.core.pipeline",
    "Train": "blocks.core.pipeline",
    "Plan": "blocks.core.plan",
    "make_plan": "blocks.core.plan",
    "Recipe": "blocks.core.recipe",
    "recipe": "blocks.core.recipe",
    "derive": "blocks.core.recipe",
    "register": "blocks.spec.registry",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'blocks' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)


def load_model(path: str) -> Any:
    """The model that ``blocks export`` wrote to directory *path*, as an ``nn.Module`` (imports torch)."""
    from blocks.runtime.load import load_model as load

    return load(path)


@contextmanager
def hydra_context(config_dir: str | None = None) -> Iterator[str]:
    """Hydra's ``initialize`` for blocks' config (catalog and project loaded); yields the config name.

    ``with hydra_context() as name: cfg = hydra.compose(name, overrides=[...])``; see
    :func:`blocks.core.jobs.hydra_context`.
    """
    from blocks.core.jobs import hydra_context as context

    with context(config_dir) as name:
        yield name


def plan(overrides: Any = (), config_dir: str | None = None) -> Plan:
    """Compose *overrides* as ``blocks plan`` does and check them; the :class:`Plan` (``plan.ok``, ``plan.errors``).

    A config that does not compose raises :class:`ConfigError` naming each key.
    """
    from blocks.core.jobs import plan as plan_of

    return plan_of(list(overrides), config_dir=config_dir)


__all__ = [
    "KINDS",
    "Block",
    "BlocksError",
    "ConfigError",
    "Evaluate",
    "Export",
    "Pipeline",
    "Plan",
    "PlanError",
    "Problem",
    "Recipe",
    "Train",
    "__version__",
    "derive",
    "hydra_context",
    "load_model",
    "make_plan",
    "plan",
    "recipe",
    "register",
]
