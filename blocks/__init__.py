"""blocks: compose PyTorch training runs from typed blocks, check them, run them anywhere.

The top-level package is torch-free: it holds the spec layer (blocks, recipes, the plan).
Building (Lightning) and launching (processes) import torch when they are used.
"""

from typing import Any

from blocks.core.block import KINDS, Block
from blocks.core.errors import BlocksError, ConfigError, PlanError, Problem
from blocks.core.pipeline import Evaluate, Export, Pipeline, Train
from blocks.core.plan import Plan, make_plan
from blocks.core.recipe import Recipe, recipe
from blocks.core.registry import register

__version__ = "0.1.0"


def load_model(path: str) -> Any:
    """The model that ``blocks export`` wrote to directory *path*, as an ``nn.Module`` (imports torch)."""
    from blocks.model.load import load_model as load

    return load(path)


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
    "load_model",
    "make_plan",
    "recipe",
    "register",
]
