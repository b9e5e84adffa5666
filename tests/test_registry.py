"""Registering blocks and recipes: the rules a block author meets."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from blocks.core.block import block_fields
from blocks.core.errors import RegistryError
from blocks.core.recipe import Recipe, RecipeBook
from blocks.core.registry import Registry
from blocks.data import Blobs
from blocks.model import MLP
from blocks.model.base import ModelBlock
from blocks.optim import AdamW
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
    assert block_fields(MLP)[0].type.startswith("tuple")


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
