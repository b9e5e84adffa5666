"""Registering blocks and recipes: the rules a block author meets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from blocks.core import catalog, jobs
from blocks.core.recipe import RECIPES, Recipe, RecipeBook
from blocks.data import Blobs
from blocks.model import MLP
from blocks.model.base import ModelBlock
from blocks.optim import AdamW
from blocks.spec.block import block_fields
from blocks.spec.errors import ConfigError, RegistryError
from blocks.spec.registry import REGISTRY, Registry
from blocks.task import Classification


@dataclass(frozen=True, kw_only=True)
class Tiny(ModelBlock):
    """A tiny model.

    Attributes:
        width: hidden width.
    """

    width: int = 4


def test_register_and_look_up() -> None:
    registry = Registry()
    registry.add(Tiny, "tiny")
    assert registry.get("model", "tiny").cls is Tiny
    assert registry.names("model") == ["tiny"]


def test_namespaced_registration_for_packages() -> None:
    registry = Registry()
    with registry.namespace("acme", "acme-blocks", "1.2.0"):
        entry = registry.add(Tiny, "tiny")
    assert entry.name == "acme/tiny" and entry.package == "acme-blocks" and entry.version == "1.2.0"


def test_two_classes_under_one_name_is_an_error_naming_both() -> None:
    registry = Registry()
    registry.add(Tiny, "tiny")

    @dataclass(frozen=True, kw_only=True)
    class Other(ModelBlock):
        """Another."""

    with pytest.raises(RegistryError, match="registered twice") as info:
        registry.add(Other, "tiny")
    assert "Tiny" in str(info.value) and "Other" in str(info.value)


def test_blocks_must_be_frozen_dataclasses_with_defaults() -> None:
    registry = Registry()

    @dataclass(frozen=True, kw_only=True)
    class NoDefault(ModelBlock):
        """A field without a default."""

        width: int

    with pytest.raises(RegistryError, match="no default"):
        registry.add(NoDefault, "nodefault")


def test_a_subclass_that_forgot_dataclass_is_refused() -> None:
    registry = Registry()

    class Wider(Tiny):
        """Forgot @dataclass: without it, this field would silently not be a block field."""

        depth: int = 2

    with pytest.raises(RegistryError, match=r"decorate it with @dataclass\(frozen=True, kw_only=True\)"):
        registry.add(Wider, "wider")


def test_every_built_in_block_is_a_dataclass_itself_that_a_config_holds() -> None:
    """Registration checks a package's or project's block with OmegaConf; blocks' own are checked here."""
    from blocks.spec.registry import unconfigurable

    catalog.load()
    registry = Registry()
    built_ins = [entry for entry in REGISTRY.entries() if entry.cls.__module__.startswith("blocks.")]
    assert len(built_ins) > 20
    for entry in built_ins:  # not the blocks other tests in this process registered
        assert registry.add(entry.cls, entry.name).cls is entry.cls
        assert unconfigurable(entry.cls) is None, entry.name


def test_lookup_suggests_close_names() -> None:
    registry = Registry()
    registry.add(Tiny, "tiny")
    with pytest.raises(RegistryError, match="did you mean 'tiny'"):
        registry.get("model", "tinny")


def test_field_docs_come_from_the_docstring() -> None:
    fields = {f.name: f for f in block_fields(AdamW)}
    assert fields["lr"].type == "float" and fields["lr"].default == 1e-3
    assert "learning rate" in fields["lr"].doc
    assert fields["beta1"].doc == "first-moment decay."
    assert fields["grad_clip"].type == "float | None"
    assert {f.name: f for f in block_fields(MLP)}["hidden"].type.startswith("tuple")


def test_recipes_register_once_and_build_blocks() -> None:
    book = RecipeBook()

    def small() -> Recipe:
        """A small recipe."""
        return Recipe(data=Blobs(), model=MLP(), task=Classification())

    entry = book.add("small", small)
    assert entry.summary == "A small recipe."
    assert set(entry.build().blocks()) == {"data", "model", "task"}

    def impostor() -> Recipe:
        return Recipe(data=Blobs(), model=MLP(), task=Classification())

    with pytest.raises(RegistryError, match="defined twice"):
        book.add("small", impostor)


def test_a_recipe_must_return_a_recipe() -> None:
    book = RecipeBook()
    entry = book.add("broken", lambda: {"data": Blobs()})  # type: ignore[arg-type,return-value]
    with pytest.raises(RegistryError, match="not a Recipe"):
        entry.build()


GOOD_RECIPE_FILE = """
from blocks import Recipe, recipe
from blocks.data import Blobs
from blocks.model import MLP
from blocks.task import Classification


@recipe("from_good_file")
def from_good_file() -> Recipe:
    \"\"\"Loads fine.\"\"\"
    return Recipe(data=Blobs(), model=MLP(hidden=(8,)), task=Classification())
"""

BROKEN_ON_IMPORT = """
from blocks import Recipe, recipe
from blocks.model import MLP

NARROW = MLP(hiden=(8,))


@recipe("from_broken_file")
def from_broken_file() -> Recipe:
    \"\"\"Never registers: the module raises first.\"\"\"
    return Recipe(data=None, model=NARROW, task=None)
"""

BROKEN_WHEN_CALLED = """
from blocks import Recipe, recipe
from blocks.data import Blobs
from blocks.model import MLP
from blocks.task import Classification


@recipe("broken_when_called")
def broken_when_called() -> Recipe:
    \"\"\"Registers, but raises when called.\"\"\"
    return Recipe(data=Blobs(), model=MLP(hiden=(8,)), task=Classification())
"""


def test_a_recipe_file_that_raises_is_skipped_and_recorded(tmp_path: Path) -> None:
    (tmp_path / "good_recipes.py").write_text(GOOD_RECIPE_FILE)
    (tmp_path / "broken_recipes.py").write_text(BROKEN_ON_IMPORT)
    problems = catalog.load_recipe_files(tmp_path, package="test-skip-broken")
    assert RECIPES.get("from_good_file").summary == "Loads fine."
    (problem,) = problems
    assert problem.path == (tmp_path / "broken_recipes.py").resolve()
    assert problem.line == 5
    assert "TypeError" in problem.message and "hiden" in problem.message
    assert problem.recipes == ("from_broken_file",)
    assert problem in catalog.load_problems()
    catalog.register_configs()  # make the recipes loaded above options of the recipe group
    with pytest.raises(ConfigError) as info:
        jobs.compose(["recipe=from_broken_file"])
    assert info.value.problems[0].key == "recipe"
    assert str(problem.path) in info.value.problems[0].message
    assert jobs.plan(["recipe=from_good_file"]).ok


def test_a_recipe_that_raises_when_called_is_skipped_and_recorded(tmp_path: Path) -> None:
    (tmp_path / "called_recipes.py").write_text(BROKEN_WHEN_CALLED)
    assert catalog.load_recipe_files(tmp_path, package="test-skip-called") == []
    catalog.register_configs()
    path = (tmp_path / "called_recipes.py").resolve()
    (problem,) = [p for p in catalog.load_problems() if p.path == path]
    assert problem.recipes == ("broken_when_called",) and problem.during == "call" and problem.line == 11
    with pytest.raises(ConfigError, match=r"called_recipes\.py:11 raised TypeError"):
        jobs.compose(["recipe=broken_when_called"])
