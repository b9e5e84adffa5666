"""From command-line overrides to a composed config, its blocks and its plan."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from blocks.core import catalog, packages
from blocks.core.block import Block
from blocks.core.compose import (
    BLOCK_KEY,
    DEFAULT_RECIPE,
    PRIMARY_CONFIG,
    Composed,
    config_to_blocks,
    split_hydra,
    translate_compose_error,
)
from blocks.core.environment import Environment
from blocks.core.errors import BlocksError, ConfigError, Problem
from blocks.core.plan import Plan, make_plan


def _compose_raw(overrides: Sequence[str]) -> DictConfig:
    from hydra import compose, initialize
    from hydra.core.global_hydra import GlobalHydra

    catalog.load()
    GlobalHydra.instance().clear()
    with initialize(version_base="1.3", config_path=None, job_name="blocks"):
        return compose(PRIMARY_CONFIG, overrides=list(overrides), return_hydra_config=True)


def compose(overrides: Sequence[str] = ()) -> Composed:
    """Compose the job config for *overrides* with Hydra; mistakes become a ``ConfigError``."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    catalog.load()
    packages.refuse_unusable(packages.namespaces_in(overrides))
    try:
        return split_hydra(_compose_raw(overrides))
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        error = translate_compose_error(exc, overrides, _known_keys(overrides))
        raise _name_broken_recipe(error, overrides) from None


def _name_broken_recipe(error: ConfigError, overrides: Sequence[str]) -> ConfigError:
    """When the chosen recipe is missing because its file failed to load, say so and name the file."""
    if not any(problem.key == "recipe" for problem in error.problems):
        return error
    chosen = DEFAULT_RECIPE
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") == "recipe":
            chosen = value
    for broken in catalog.load_problems():
        if chosen in broken.recipes:
            return ConfigError(
                Problem(
                    "recipe",
                    f"recipe '{chosen}' could not be loaded: {broken.where} raised {broken.message}",
                    f"correct {broken.path}, or choose another recipe",
                )
            )
    return error


def _known_keys(overrides: Sequence[str]) -> dict[str, list[str]]:
    """Keys of each group's node when the overrides that set keys are left out (for did-you-mean)."""
    group_choices = [o for o in overrides if "." not in o.split("=", 1)[0] and not o.startswith(("+", "~"))]
    try:
        cfg = _compose_raw(group_choices)
    except Exception:
        try:
            cfg = _compose_raw([])
        except Exception:
            return {}
    return {
        str(group): [str(k) for k in node if k != BLOCK_KEY]
        for group, node in cfg.items()
        if group != "hydra" and isinstance(node, DictConfig)
    }


def plan_config(composed: Composed, environment: Environment | None = None) -> Plan:
    """The plan of a composed config."""
    blocks = config_to_blocks(composed.config)
    packages.refuse_incompatible_blocks(blocks.values())
    return make_plan(blocks, composed.choices, environment)


def plan(overrides: Sequence[str] = (), environment: Environment | None = None) -> Plan:
    """Compose *overrides* and plan the result (torch-free)."""
    return plan_config(compose(overrides), environment)


def blocks_for(overrides: Sequence[str] = ()) -> dict[str, Block]:
    """The blocks *overrides* compose to, without planning."""
    return config_to_blocks(compose(overrides).config)


__all__ = ["BlocksError", "Composed", "blocks_for", "compose", "plan", "plan_config"]
