"""Recipes: Python functions that compose blocks into a job, each an option of the ``recipe`` group."""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from blocks.checkpoint.base import CheckpointBlock
from blocks.core.pipeline import Pipeline
from blocks.data.base import DataBlock
from blocks.model.base import ModelBlock
from blocks.monitor.base import MonitorBlock
from blocks.optim.base import OptimBlock
from blocks.precision.base import PrecisionBlock
from blocks.spec.block import KINDS, Block
from blocks.spec.errors import DuplicateName, Problem, RegistryError, did_you_mean
from blocks.strategy.base import StrategyBlock
from blocks.task.base import TaskBlock
from blocks.trainer.base import TrainerBlock


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """The blocks of a job. A kind left as None takes the group's default option.

    Attributes:
        data: where samples come from.
        model: the network.
        task: loss and metrics.
        optim: optimizer, schedule, accumulation (default ``adamw``).
        strategy: how training spreads over processes (default ``single``).
        precision: numeric formats (default ``32-true``).
        checkpoint: saving and resuming (default ``default``).
        monitor: metrics and progress (default ``default``).
        trainer: length, hardware, seed (default ``default``).
    """

    data: DataBlock
    model: ModelBlock
    task: TaskBlock
    optim: OptimBlock | None = None
    strategy: StrategyBlock | None = None
    precision: PrecisionBlock | None = None
    checkpoint: CheckpointBlock | None = None
    monitor: MonitorBlock | None = None
    trainer: TrainerBlock | None = None

    def blocks(self) -> dict[str, Block]:
        """The blocks the recipe sets, by kind (kinds left to their defaults are absent)."""
        return {kind: block for kind in KINDS if (block := getattr(self, kind)) is not None}


RecipeFn = Callable[[], Recipe | Pipeline]


def source_file(obj: object) -> str:
    """The file that defines *obj* (a function or class), or its module's name when unknown."""
    try:
        found = inspect.getsourcefile(obj)  # type: ignore[arg-type]
    except TypeError:
        found = None
    return found or str(getattr(obj, "__module__", "?"))


F = TypeVar("F", bound=RecipeFn)


@dataclass(frozen=True)
class RecipeEntry:
    """A registered recipe function and where it came from."""

    name: str
    fn: RecipeFn
    package: str
    source: str

    @property
    def file(self) -> str:
        """The file that defines the recipe function."""
        return source_file(self.fn)

    @property
    def summary(self) -> str:
        """The first line of the function's docstring."""
        doc = (self.fn.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""

    def make(self) -> Recipe | Pipeline:
        """Call the recipe function: a :class:`Recipe` of blocks or a :class:`Pipeline` of stages."""
        result = self.fn()
        if isinstance(result, Pipeline):
            return result
        if not isinstance(result, Recipe):
            raise RegistryError(
                f"recipe '{self.name}' ({self.source}) returned {type(result).__name__}, not a Recipe or Pipeline"
            )
        for f in dataclasses.fields(result):
            value = getattr(result, f.name)
            if value is not None and not isinstance(value, Block):
                raise RegistryError(f"recipe '{self.name}' sets {f.name} to {value!r}, which is not a block")
        return result

    def build(self) -> Recipe:
        """The recipe's blocks; a pipeline recipe is an error here (it has no single job)."""
        result = self.make()
        if isinstance(result, Pipeline):
            raise RegistryError(f"recipe '{self.name}' is a pipeline of stages, not one job")
        return result

    def pipeline(self) -> Pipeline | None:
        """The pipeline the recipe returns, or None for a single-job recipe."""
        result = self.make()
        return result if isinstance(result, Pipeline) else None


class RecipeBook:
    """Every registered recipe by name."""

    def __init__(self) -> None:
        self._entries: dict[str, RecipeEntry] = {}
        self._namespace = ""
        self._package = "blocks"
        self.owner: Callable[[str], tuple[str, str, str] | None] = lambda module: None
        """Maps a recipe function's module to its block package (see ``Registry.owner``)."""

    @contextmanager
    def collecting(self) -> Iterator[RecipeBook]:
        """Make ``@recipe`` add to this book inside the block (a catalog's own recipes)."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    @contextmanager
    def namespace(self, prefix: str, package: str) -> Iterator[None]:
        """Register the recipes defined inside the block under ``prefix/`` for *package*."""
        saved = self._namespace, self._package
        self._namespace, self._package = prefix, package
        try:
            yield
        finally:
            self._namespace, self._package = saved

    def drop_namespace(self, prefix: str) -> None:
        """Forget every recipe registered under ``prefix/`` (a package that failed half-way)."""
        for name in [n for n in self._entries if n.startswith(prefix + "/")]:
            del self._entries[name]

    def add(self, name: str, fn: RecipeFn) -> RecipeEntry:
        """Register *fn* as recipe *name*; a second function under the same name is an error."""
        owner = self.owner(fn.__module__)
        namespace, package = (owner[0], owner[1]) if owner else (self._namespace, self._package)
        full = f"{namespace}/{name}" if namespace else name
        source = f"{fn.__module__}.{fn.__qualname__}"
        existing = self._entries.get(full)
        if existing is not None and existing.source != source:
            raise DuplicateName(
                Problem(
                    "recipe",
                    f"recipe '{full}' is defined twice: {existing.source} in {existing.file} "
                    f"and {source} in {source_file(fn)}",
                    "rename one of them (recipe names share one namespace with blocks' own and the project's)",
                    check="name-clash",
                )
            )
        entry = RecipeEntry(full, fn, package, source)
        self._entries[full] = entry
        return entry

    def add_entry(self, entry: RecipeEntry) -> None:
        """Add a recipe another book holds already (a catalog starting from blocks' shipped recipes)."""
        self._entries.setdefault(entry.name, entry)

    def get(self, name: str) -> RecipeEntry:
        """The recipe called *name*, or a did-you-mean error."""
        try:
            return self._entries[name]
        except KeyError:
            hint = did_you_mean(name, self._entries)
            raise RegistryError(f"no recipe named '{name}'" + (f"; {hint}" if hint else "")) from None

    def entries(self) -> list[RecipeEntry]:
        """All recipes, by name."""
        return [self._entries[n] for n in sorted(self._entries)]


RECIPES = RecipeBook()
"""The default recipe book: what ``@recipe`` adds outside a catalog's :meth:`RecipeBook.collecting`."""

_ACTIVE: contextvars.ContextVar[RecipeBook] = contextvars.ContextVar("blocks_recipes", default=RECIPES)


def active_recipes() -> RecipeBook:
    """The book ``@recipe`` adds to (and :func:`derive` looks bases up in) here."""
    return _ACTIVE.get()


Changes = Block | Mapping[str, Any]
"""What :func:`derive` takes for a kind: a whole block, or the fields to change on the base's block."""


def derive(base: str, **changes: Changes) -> Recipe:
    """The blocks of recipe *base* with *changes*, one keyword per kind.

    A kind given a block replaces the base's block; given a mapping, it changes those fields
    of the base's block (``model={"freeze": ("0",)}``). The base is looked up when the
    derived recipe is called, so the two may live in any files. It is the same as
    ``dataclasses.replace`` on the base recipe's output, for a base you cannot import.

    Example::

        @recipe("digits_wide")
        def digits_wide() -> Recipe:
            return derive("digits_mlp", model={"hidden": (512, 256)}, optim=SGD(lr=0.05))
    """
    made = _ACTIVE.get().get(base).build()
    unknown = [kind for kind in changes if kind not in KINDS]
    if unknown:
        hint = did_you_mean(unknown[0], KINDS)
        raise RegistryError(
            f"derive('{base}', {unknown[0]}=...): '{unknown[0]}' is not a block kind"
            + (f"; {hint}" if hint else "")
            + f" (kinds: {', '.join(KINDS)})"
        )
    replaced: dict[str, Block] = {}
    for kind, change in changes.items():
        if isinstance(change, Block):
            replaced[kind] = change
            continue
        current = getattr(made, kind)
        if current is None:
            raise RegistryError(
                f"derive('{base}', {kind}={{...}}): recipe '{base}' leaves {kind} to its default option, "
                f"so there are no fields to change; give a whole block ({kind}=...)"
            )
        names = {f.name for f in dataclasses.fields(current)}
        wrong = [key for key in change if key not in names]
        if wrong:
            raise RegistryError(
                f"derive('{base}', {kind}={{...}}): {kind}={current.block_name} has no field '{wrong[0]}' "
                f"(fields: {', '.join(sorted(names))})"
            )
        replaced[kind] = dataclasses.replace(current, **change)
    return dataclasses.replace(made, **replaced)  # type: ignore[arg-type]


class RecipeDecorator:
    """What :func:`recipe` returns: a decorator for a recipe function, or :meth:`based_on`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, fn: F) -> F:
        """Register *fn* as the recipe."""
        _ACTIVE.get().add(self.name, fn)
        return fn

    def based_on(self, base: str, /, **changes: Changes) -> RecipeFn:
        """Register a recipe that is recipe *base* with *changes* (see :func:`derive`); returns its function."""

        def derived() -> Recipe:
            return derive(base, **changes)

        derived.__doc__ = f"Recipe {base}, changing {', '.join(changes) or 'nothing'}."
        derived.__qualname__ = derived.__name__ = f"{self.name}_based_on_{base}".replace("/", "_").replace(
            "-", "_"
        )
        derived.__module__ = inspect.stack(0)[1].frame.f_globals.get("__name__", __name__)
        _ACTIVE.get().add(self.name, derived)
        return derived


def recipe(name: str) -> RecipeDecorator:
    """Decorator: make a function returning a :class:`Recipe` an option of the ``recipe`` group.

    Example::

        @recipe("charlm")
        def charlm() -> Recipe:
            return Recipe(data=Text(), model=Transformer(), task=LanguageModeling())

    A recipe that only changes another one can be declared in one line::

        recipe("digits_wide").based_on("digits_mlp", model={"hidden": (512, 256)})
    """
    return RecipeDecorator(name)
