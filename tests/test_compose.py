"""Every recipe and preset composes with Hydra and plans; overrides and swaps behave."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hydra import compose, initialize
from hydra.core.global_hydra import GlobalHydra
from omegaconf import MISSING

from blocks.core import catalog, jobs
from blocks.core.compose import PRIMARY_CONFIG, config_to_blocks, split_hydra
from blocks.core.recipe import RECIPES
from blocks.data import Text
from blocks.launch.sweep import expand_sweep
from blocks.model import MLP, Transformer
from blocks.spec.errors import ConfigError
from blocks.spec.registry import REGISTRY, register

catalog.load()


@register("mlp_with_required_width")
@dataclass(frozen=True, kw_only=True)
class MLPWithRequiredWidth(MLP):
    """An MLP with a field the user must give (``omegaconf.MISSING``).

    Attributes:
        width: a value with no default.
    """

    width: int = MISSING


catalog.register_configs()  # make the block registered above a config option
YAML_RECIPES = ["tiny_lm"]
# Pipeline recipes are no config option (their stages are; see tests/test_recipes.py).
ALL_RECIPES = sorted({e.name for e in RECIPES.entries() if e.pipeline() is None} | set(YAML_RECIPES))


def hydra_compose(overrides: list[str]):
    """Compose through Hydra's own compose API, as Lightning-Hydra-Template's tests do."""
    GlobalHydra.instance().clear()
    with initialize(version_base="1.3", config_path=None):
        return compose(PRIMARY_CONFIG, overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_every_recipe_composes_and_plans(recipe: str) -> None:
    composed = split_hydra(hydra_compose([f"recipe={recipe}"]))
    assert composed.choices["recipe"] == recipe
    plan = jobs.plan_config(composed)
    assert plan.ok, [p.render() for p in plan.problems]
    assert plan.derived.total_steps > 0
    assert plan.derived.global_batch == plan.data.batch_size * plan.optim.accumulate


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_debug_preset_applies_on_every_recipe(recipe: str) -> None:
    plan = jobs.plan([f"recipe={recipe}", "debug=fast"])
    assert plan.ok
    assert plan.derived.total_steps == 5
    assert plan.monitor.log_every_n_steps == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(("kind", "name"), [(e.kind, e.name) for e in REGISTRY.entries()])
def test_every_block_is_a_group_option(kind: str, name: str) -> None:
    config = hydra_compose([f"{kind}={name}"])
    assert config[kind]["_block_"] == name


def test_default_recipe_is_charlm_with_its_presets() -> None:
    composed = jobs.compose([])
    assert composed.choices["recipe"] == "charlm"
    blocks = config_to_blocks(composed.config)
    assert isinstance(blocks["data"], Text)
    assert isinstance(blocks["model"], Transformer)
    assert blocks["model"].d_model == 128  # from the recipe, not the block default


def test_overrides_apply_on_top_of_a_recipe() -> None:
    blocks = jobs.blocks_for(["optim.lr=1e-4", "model.n_layers=2", "data.batch_size=8"])
    assert blocks["optim"].lr == pytest.approx(1e-4)
    assert blocks["model"].n_layers == 2
    assert blocks["data"].batch_size == 8
    assert blocks["model"].d_model == 128  # untouched recipe setting survives


def test_swapping_a_block_drops_the_recipes_settings_for_the_old_one() -> None:
    blocks = jobs.blocks_for(["recipe=blobs", "model=mlp", "model.hidden=[16]"])
    assert blocks["model"] == MLP(hidden=(16,))
    swapped = jobs.blocks_for(["model=transformer", "data=text", "task=lm"])
    assert swapped["model"] == Transformer()  # charlm's transformer settings do not leak in


def test_tuple_fields_come_back_as_tuples() -> None:
    blocks = jobs.blocks_for(["recipe=blobs", "model.hidden=[8,4]"])
    assert blocks["model"].hidden == (8, 4)


def test_overrides_are_type_checked() -> None:
    with pytest.raises(ConfigError) as info:
        jobs.compose(["optim.lr=abc"])
    assert info.value.problems[0].key == "optim.lr"


def test_sweep_expands_to_every_combination() -> None:
    jobs_ = expand_sweep(["recipe=blobs", "optim=adamw,sgd", "optim.lr=0.1,0.01"])
    assert len(jobs_) == 4
    assert ["recipe=blobs", "optim=sgd", "optim.lr=0.01"] in jobs_


def test_glob_sweep_over_a_group() -> None:
    jobs_ = expand_sweep(["precision=glob(bf16*)"])
    assert sorted(j[0] for j in jobs_) == ["precision=bf16-mixed", "precision=bf16-true"]


def test_a_required_field_without_a_value_names_the_key_and_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        jobs.plan(["recipe=blobs", "model=mlp_with_required_width"])
    (problem,) = info.value.problems
    assert problem.key == "model.width"
    assert problem.message == "is required and has no value"
    assert problem.fix == "model.width=<value>"
    given = jobs.blocks_for(["recipe=blobs", "model=mlp_with_required_width", "model.width=3"])
    assert given["model"] == MLPWithRequiredWidth(width=3)


def test_a_composed_config_becomes_blocks_without_validating_its_nodes_a_second_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Composition types each block's node by its dataclass; turning it into blocks re-validates nothing."""
    from omegaconf import OmegaConf

    composed = jobs.compose(["recipe=charlm", "optim.lr=0.5", "model.dropout=0.25"])
    plain = OmegaConf.to_container(composed.config, resolve=False)
    real_structured = OmegaConf.structured
    structured = []

    def counting(obj: object, *args: object, **kwargs: object) -> object:
        structured.append(obj)
        return real_structured(obj, *args, **kwargs)

    monkeypatch.setattr(OmegaConf, "structured", counting)
    typed = config_to_blocks(composed.config)
    assert structured == []
    assert typed["optim"].lr == 0.5 and typed["model"].dropout == 0.25
    assert config_to_blocks(plain) == typed  # a saved (untyped) config gives the same blocks, validated
    assert len(structured) == len(typed)


def test_an_unresolvable_interpolation_is_named_by_its_own_key_and_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unset variable names its key; a valid interpolation given beside it is not blamed."""
    monkeypatch.delenv("BLOCKS_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError) as info:
        jobs.compose(
            ["recipe=blobs", "model.dropout=${optim.lr}", "trainer.max_epochs=${oc.env:BLOCKS_TEST_UNSET}"]
        )
    (problem,) = info.value.problems
    assert problem.key == "trainer.max_epochs" and "BLOCKS_TEST_UNSET" in problem.message


def test_an_interpolation_of_a_value_nobody_gave_is_refused_at_the_interpolation() -> None:
    with pytest.raises(ConfigError) as info:
        jobs.compose(["recipe=blobs", "model=mlp_with_required_width", "trainer.seed=${model.width}"])
    (problem,) = info.value.problems
    assert problem.key == "trainer.seed" and "model.width" in problem.message


def test_an_environment_value_of_the_wrong_type_names_the_key_and_the_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BLOCKS_TEST_HIDDEN", "[8,8]")
    with pytest.raises(ConfigError) as info:
        jobs.blocks_for(["recipe=blobs", "model.hidden=${oc.env:BLOCKS_TEST_HIDDEN}"])
    (problem,) = info.value.problems
    assert (
        problem.key == "model.hidden" and problem.fix == "give model.hidden a list, e.g. model.hidden=[64,64]"
    )
