"""Loading everything that can be composed: built-in blocks, shipped recipes, config groups."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from blocks.core import paths
from blocks.core.compose import block_node, primary_node
from blocks.core.errors import RegistryError
from blocks.core.recipe import RECIPES
from blocks.core.registry import REGISTRY

BUILTIN_KINDS = (
    "blocks.data",
    "blocks.model",
    "blocks.task",
    "blocks.optim",
    "blocks.strategy",
    "blocks.precision",
    "blocks.checkpoint",
    "blocks.monitor",
    "blocks.trainer",
)

_loaded = False


def load() -> None:
    """Import built-in blocks and recipes and register every config group option (once)."""
    global _loaded
    if _loaded:
        return
    for module in BUILTIN_KINDS:
        importlib.import_module(module)
    recipes = paths.recipes_dir()
    if recipes is not None:
        load_recipe_files(recipes)
    register_configs()
    _loaded = True


def load_recipe_files(directory: Path, *, package: str = "blocks") -> None:
    """Import every ``*.py`` recipe file in *directory* (its ``@recipe`` functions register)."""
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        module_name = f"blocks_recipes.{package.replace('-', '_')}.{path.stem}"
        if module_name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)


def register_configs() -> None:
    """Store every block and recipe in Hydra's ConfigStore, plus the primary config."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for entry in REGISTRY.entries():
        store.store(group=entry.kind, name=entry.name, node=block_node(entry.cls()))
    for recipe_entry in RECIPES.entries():
        recipe = recipe_entry.build()
        defaults = []
        for kind, block in recipe.blocks().items():
            option = block.block_name
            if block != type(block)():
                option = recipe_entry.name
                if option in REGISTRY.names(kind):
                    raise RegistryError(
                        f"recipe '{option}' customizes its {kind} block, and its preset would shadow the "
                        f"{kind} block '{option}'; rename the recipe"
                    )
                store.store(group=kind, name=option, node=block_node(block))
            defaults.append({f"override /{kind}": option})
        store.store(group="recipe", name=recipe_entry.name, node={"defaults": defaults}, package="_global_")
    conf = paths.conf_dir()
    store.store(name="blocks", node=primary_node([str(conf)] if conf else []))
