"""Loading everything that can be composed: built-in blocks, shipped recipes, config groups.

A recipe file that raises when it is imported, or a recipe that raises when it is called, is
skipped and recorded as a :class:`LoadProblem`: the rest of the catalog still loads, the CLI
shows each problem as a warning, and choosing a recipe that could not load names the file.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from blocks.compat.hydra_private import config_store_repo, swap_config_store_repo
from blocks.core import packages, paths, project
from blocks.core.compose import DEFAULT_RECIPE, GROUPS, PRIMARY_CONFIG, block_node, primary_node
from blocks.core.config_repo import ConfigRepo
from blocks.core.launcher import RAY_LAUNCHER_NODE
from blocks.core.pipeline import Pipeline
from blocks.core.recipe import RECIPES, RecipeBook, RecipeEntry, active_recipes
from blocks.spec.block import KINDS as REGISTRY_KINDS
from blocks.spec.errors import ConfigError, DuplicateName, Problem, RegistryError, describe_exception
from blocks.spec.kinds import KIND_TABLE
from blocks.spec.registry import REGISTRY, Entry, Registry

BUILTIN_KINDS = tuple(kind.package for kind in KIND_TABLE)
"""The packages whose modules register the built-in blocks (from the kind table)."""

_RECIPE_DECORATOR = re.compile(r"""@recipe\(\s*["']([^"']+)["']""")


@dataclass(frozen=True)
class LoadProblem:
    """A recipe file, or one recipe in it, that raised while loading and was skipped.

    Attributes:
        path: the recipe file.
        message: the exception, as ``Type: message``.
        recipes: the recipe names the file declares with ``@recipe("...")`` (read from its
            source, since the file could not run), or the one recipe that raised.
        line: the line of the file where it raised, when known.
        during: ``import`` (the whole file was skipped) or ``call`` (the recipe function raised
            when called, and only that recipe was skipped).
        group: the config group of the option the file makes (``recipe``, or ``model`` for a
            package's model preset); the warning is keyed by it.
    """

    path: Path
    message: str
    recipes: tuple[str, ...] = ()
    line: int | None = None
    during: Literal["import", "call"] = "import"
    group: str = "recipe"

    @property
    def where(self) -> str:
        """``path:line``, or the path alone."""
        return f"{self.path}:{self.line}" if self.line else str(self.path)

    def warning(self) -> Problem:
        """The problem as a warning for the CLI: every other recipe still works."""
        names = ", ".join(self.recipes)
        skipped = "the file was skipped" if self.during == "import" else f"recipe '{names}' was skipped"
        fix = "correct the file" + (f"; until then {names} cannot be chosen" if names else "")
        return Problem(
            self.group,
            f"{self.where} raised {self.message}; {skipped}",
            fix,
            severity="warning",
            check="recipe-load",
        )


_problems: dict[tuple[Path, str], LoadProblem] = {}


def load_problems() -> list[LoadProblem]:
    """Every recipe file and recipe that failed to load in this process, in the order found."""
    return list(_problems.values())


def _record(problem: LoadProblem) -> LoadProblem:
    return _problems.setdefault((problem.path, problem.message), problem)


@dataclass(eq=False)
class Catalog:
    """Everything that can be composed: blocks, recipes, packages' and the project's presets.

    Built once per process entry by :func:`build_catalog` and passed to what composes and
    plans (:func:`blocks.core.jobs.plan`, :func:`blocks.core.jobs.hydra_context`). Its
    registry lists blocks by import path, and its config options are built when Hydra first
    loads them, so building a catalog imports no block and planning imports only the chosen
    blocks' modules. Hydra's global ConfigStore sees the catalog only inside
    :meth:`installed` (one composition) or after :meth:`install` (the command-line edge).

    Attributes:
        registry: the blocks, by kind and name.
        recipes: the Python recipes, by name.
        project: the user's project (recipe files and preset dirs).
        presets: the YAML presets of block packages and of the project, parsed.
    """

    registry: Registry
    recipes: RecipeBook
    project: project.Project = field(default_factory=lambda: project.Project(None, (), ()))
    presets: list[Preset] = field(default_factory=list)
    _made: dict[str, _MadeRecipe | None] = field(default_factory=dict, repr=False)
    _built: dict[tuple[object, ...], dict[str, Any]] = field(default_factory=dict, repr=False)

    @contextmanager
    def active(self) -> Iterator[Catalog]:
        """``@register``, ``@recipe`` and block look-ups use this catalog inside the block."""
        with self.registry.collecting(), self.recipes.collecting(), _using(self):
            yield self

    def config_repo(self) -> ConfigRepo:
        """The catalog's config options, in a store of their own (see :class:`ConfigRepo`).

        A block's, a made recipe's and a preset's node is built once per catalog, however many
        compositions load it.
        """
        repo = ConfigRepo()
        for entry in self.registry.entries():
            repo.add(
                entry.kind,
                entry.name,
                _BlockNode(entry),
                source=entry.target,
                built=self._memo(*_block_key(entry)),
            )
        for recipe_entry in self.recipes.entries():
            made = self._made.get(recipe_entry.name, _UNMADE)
            if made is None:
                continue  # raised when called, or a pipeline: no config option
            if isinstance(made, _MadeRecipe):
                for kind, node in made.presets:
                    repo.add(
                        kind,
                        recipe_entry.name,
                        node,
                        source=f"recipe {recipe_entry.source}",
                        built=self._memo("preset", kind, recipe_entry.name, recipe_entry.source),
                    )
                repo.add(
                    "recipe",
                    recipe_entry.name,
                    {"defaults": made.defaults},
                    source=recipe_entry.source,
                    package="_global_",
                    built=self._memo("recipe", recipe_entry.name, recipe_entry.source),
                )
            else:
                repo.add(
                    "recipe",
                    recipe_entry.name,
                    functools.partial(self._recipe_node, recipe_entry),
                    source=recipe_entry.source,
                    package="_global_",
                )
        for preset in self.presets:
            repo.add(
                preset.group,
                preset.option,
                preset.node,
                source=str(preset.path),
                package=preset.package,
                built=self._memo("preset", preset.group, preset.option, str(preset.path)),
            )
        repo.add(
            "hydra/launcher",
            "ray",
            RAY_LAUNCHER_NODE,
            source="blocks.core.launcher",
            built=self._memo("ray launcher"),
        )
        conf_dirs = [str(conf)] if (conf := paths.conf_dir()) else []
        repo.add(
            None,
            PRIMARY_CONFIG,
            primary_node(conf_dirs),
            source="blocks.core.compose",
            built=self._memo("primary", *conf_dirs),
        )
        return repo

    def _memo(self, *key: object) -> dict[str, Any]:
        """Where the option that *key* names keeps its built node (``ConfigRepo.add``'s ``built``)."""
        return self._built.setdefault(key, {})

    def make_recipes(self, names: Iterable[str] | None = None) -> int:
        """Call the recipes named (every one by default), so their presets become options; how many were new.

        A recipe that raises is recorded as a :class:`LoadProblem` and is no option.
        """
        wanted = set(names) if names is not None else None
        made = 0
        for recipe_entry in self.recipes.entries():
            if (wanted is None or recipe_entry.name in wanted) and recipe_entry.name not in self._made:
                self._make(recipe_entry)
                made += 1
        return made

    def prepare(self, overrides: Sequence[str]) -> None:
        """Call the recipes a command line names (and the default one), before composing it."""
        words = {w for o in overrides for w in re.split(r"[=,\[\]\s()'\"]+", o.partition("=")[2]) if w}
        chosen = [o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+") == "recipe"]
        self.make_recipes({*words, *(chosen[-1:] or [DEFAULT_RECIPE])})

    def customizes(self, recipe_name: str, kind: str) -> bool:
        """Whether recipe *recipe_name* makes a preset of *kind* (option ``<kind>=<recipe_name>``); calls it."""
        self.make_recipes([recipe_name])
        made = self._made.get(recipe_name)
        return isinstance(made, _MadeRecipe) and any(k == kind for k, _ in made.presets)

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Hydra's ConfigStore holds exactly this catalog's options inside the block."""
        with self.active(), self.config_repo().installed():
            yield

    def install(self) -> None:
        """Write the catalog's options into Hydra's global ConfigStore (once, at the command-line edge)."""
        self.config_repo().install()

    def _make(self, recipe_entry: RecipeEntry) -> _MadeRecipe | None:
        try:
            with self.active():
                made = _made_recipe(recipe_entry, self.registry)
        except (
            Exception,
            SystemExit,
        ) as exc:  # a recipe that exits is a broken recipe, not the end of blocks
            source = inspect.getsourcefile(recipe_entry.fn)
            path = Path(source).resolve() if source else Path(recipe_entry.source)
            line = _line_in(exc, path) or _first_line(recipe_entry.fn)
            _record(LoadProblem(path, describe_exception(exc), (recipe_entry.name,), line, "call"))
            made = None
        self._made[recipe_entry.name] = made
        return made

    def _recipe_node(self, recipe_entry: RecipeEntry) -> dict[str, Any]:
        """A recipe Hydra loads before :meth:`prepare` saw it: make it, and add its presets to the live store."""
        made = self._made.get(recipe_entry.name) or self._make(recipe_entry)
        if made is None:
            raise RegistryError(f"recipe '{recipe_entry.name}' could not be made; see the warnings above")
        live = ConfigRepo()
        for kind, node in made.presets:
            live.add(kind, recipe_entry.name, node, source=f"recipe {recipe_entry.source}")
        swap_config_store_repo(live.merged_into(config_store_repo()))
        return {"defaults": made.defaults}


@dataclass(frozen=True)
class Preset:
    """A YAML preset of a block package or of the project: option *option* of *group*."""

    group: str
    option: str
    node: Any
    package: str | None
    path: Path


@dataclass(frozen=True)
class _MadeRecipe:
    defaults: list[dict[str, str]]
    presets: list[tuple[str, DictConfig]]


_UNMADE = object()


def _block_key(entry: Entry) -> tuple[object, ...]:
    """What a block's built node is kept under: its import path, or the class itself when it has none.

    A block listed by import path and the same class once its module ran ``@register`` share
    the key; a class defined inside a function (``<locals>`` in its path) is keyed by itself.
    """
    in_function = entry.registered is not None and "<locals>" in entry.target
    return ("block", entry.kind, entry.name, entry.target, entry.registered if in_function else None)


class _BlockNode:
    """Builds a registered block's config node when Hydra first loads it (imports its class then)."""

    def __init__(self, entry: Entry) -> None:
        self.entry = entry

    def __call__(self) -> DictConfig:
        entry = self.entry
        try:
            cls = entry.cls
        except Exception as exc:  # the block's module, or something it imports, is missing or raises
            raise ConfigError(
                Problem(
                    entry.kind,
                    f"{entry.kind} block '{entry.name}' ({entry.target}, from {entry.package} "
                    f"{entry.version}) cannot be loaded: {describe_exception(exc)}",
                    f"install what its module needs (or reinstall {entry.package}), "
                    f"or choose another {entry.kind} block (`blocks list {entry.kind}`)",
                    check="block-import",
                )
            ) from exc
        try:
            return block_node(cls())
        except OmegaConfBaseException as exc:  # a field of a type a config cannot hold: the block's fault
            field_name = str(getattr(exc, "full_key", "") or "")
            key = f"{entry.kind}.{field_name}" if field_name else entry.kind
            raise ConfigError(
                Problem(
                    key,
                    f"{entry.kind} block '{entry.name}' ({entry.target}, from {entry.package} {entry.version}) "
                    f"cannot be configured: {describe_exception(exc)}",
                    f"report it to the maintainers of {entry.package} (a block field must be a type a config holds: "
                    f"bool, int, float, str, an enum, a path, a list or tuple of one, or a dict); "
                    f"until then choose another {entry.kind} block (`blocks list {entry.kind}`)",
                    check="block-import",
                )
            ) from exc


def _made_recipe(recipe_entry: RecipeEntry, registry: Registry) -> _MadeRecipe | None:
    """The defaults list and presets of a recipe option (None for a pipeline, which is no option)."""
    made = recipe_entry.make()
    if isinstance(made, Pipeline):
        return None  # a pipeline is no config option: `blocks run` runs its stages (blocks.launch.pipeline)
    defaults = []
    presets = []
    for kind, block in made.blocks().items():
        option = block.block_name
        if block != type(block)():
            option = recipe_entry.name
            if option in registry.names(kind):
                raise RegistryError(
                    f"recipe '{option}' customizes its {kind} block, and its preset would shadow the "
                    f"{kind} block '{option}'; rename the recipe"
                )
            presets.append((kind, block_node(block)))
        defaults.append({f"override /{kind}": option})
    return _MadeRecipe(defaults, presets)


_CURRENT: contextvars.ContextVar[Catalog | None] = contextvars.ContextVar("blocks_catalog", default=None)


@contextmanager
def _using(catalog: Catalog) -> Iterator[None]:
    token = _CURRENT.set(catalog)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def build_catalog(
    *,
    registry: Registry | None = None,
    recipes: RecipeBook | None = None,
    with_packages: bool = True,
    with_project: bool = True,
) -> Catalog:
    """Build a catalog: blocks' own blocks and recipes, installed packages, the project's recipes and presets.

    Without *registry* and *recipes* the catalog gets fresh ones (built-in blocks listed by
    import path, blocks' shipped recipes), so it sees no block another catalog registered.
    The default catalog of a process (:func:`default_catalog`) passes the process-wide
    :data:`~blocks.spec.registry.REGISTRY` and :data:`~blocks.core.recipe.RECIPES` instead.
    """
    fresh = registry is None
    registry = registry if registry is not None else Registry.builtin()
    recipes = recipes if recipes is not None else RecipeBook()
    shipped = paths.recipes_dir()
    if shipped is not None:
        load_recipe_files(shipped)  # into the default book, once per process
    if fresh or recipes is not RECIPES:
        for recipe_entry in RECIPES.entries():
            if recipe_entry.source.startswith(_SHIPPED_PREFIX):
                recipes.add_entry(recipe_entry)
    catalog = Catalog(registry, recipes)
    if with_packages:
        packages.discover()
        if registry is not REGISTRY:
            # a package's modules register once per process, into the default registry and book
            owned = {f"{package.namespace}/" for package in packages.packages()}
            for entry in REGISTRY.entries():
                if entry.name.startswith(tuple(owned)):
                    registry.add_entry(entry)
            for recipe_entry in RECIPES.entries() if recipes is not RECIPES else ():
                if recipe_entry.name.startswith(tuple(owned)):
                    recipes.add_entry(recipe_entry)
    found = project.find() if with_project else catalog.project
    catalog.project = found
    with catalog.active():
        load_project_recipes(found.recipes)
    if with_packages:
        for package in packages.packages():
            if package.conf is not None:
                catalog.presets += package_presets(package.namespace, package.conf, registry)
    for conf_dir in found.conf:
        catalog.presets += project_presets(catalog, conf_dir)
    return catalog


_SHIPPED_PREFIX = "blocks_recipes.blocks."
_default: Catalog | None = None


def default_catalog() -> Catalog:
    """The catalog of this process: built on first use, over the default registry and recipe book."""
    global _default
    if _default is None:
        _default = build_catalog(registry=REGISTRY, recipes=RECIPES)
    return _default


def current() -> Catalog:
    """The catalog a :meth:`Catalog.active` block names, else :func:`default_catalog`."""
    return _CURRENT.get() or default_catalog()


def load() -> Catalog:
    """The default catalog, its options written into Hydra's global ConfigStore (the command-line edge)."""
    catalog = current()
    catalog.install()
    return catalog


def load_project_recipes(directories: tuple[Path, ...]) -> list[LoadProblem]:
    """Import the project's recipe files as ``blocks_project.<stem>`` (see :mod:`blocks.core.project`).

    A file that raises is skipped with a warning, as a shipped one is; a recipe or block whose
    name is taken already (by blocks, a package or another project file) is an error that
    names both files.
    """
    if not directories:
        return []
    project.install_module(directories)
    seen: dict[str, Path] = {}
    problems = []
    for directory in directories:
        for path in sorted(directory.glob("*.py")):
            if path.name.startswith("_"):
                continue
            if path.stem in seen:
                raise project.clash(f"recipe module '{path.stem}'", str(seen[path.stem]), str(path))
            seen[path.stem] = path
            module_name = project.module_name(path)
            if module_name in sys.modules:
                continue
            try:
                importlib.import_module(module_name)
            except DuplicateName:
                sys.modules.pop(module_name, None)
                raise
            except (Exception, SystemExit) as exc:  # a file that exits at import is a load problem too
                sys.modules.pop(module_name, None)
                problem = LoadProblem(
                    path.resolve(), describe_exception(exc), _declared_recipes(path), _line_in(exc, path)
                )
                problems.append(_record(problem))
    _refuse_shadowed_yaml_recipes()
    return problems


def _refuse_shadowed_yaml_recipes() -> None:
    """A Python recipe named like a YAML recipe of blocks' own ``conf/recipe`` is a clash."""
    for directory in _shipped_conf_dirs():
        for entry in active_recipes().entries():
            yaml = directory / "recipe" / f"{entry.name}.yaml"
            if yaml.is_file():
                raise project.clash(f"recipe '{entry.name}'", str(yaml), entry.file)


def _shipped_conf_dirs() -> list[Path]:
    conf = paths.conf_dir()
    return [conf] if conf is not None else []


def load_recipe_files(directory: Path, *, package: str = "blocks") -> list[LoadProblem]:
    """Import every ``*.py`` recipe file in *directory* (its ``@recipe`` functions register).

    A file that raises is skipped; the problems found are returned and also kept for
    :func:`load_problems`.
    """
    problems = []
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        module_name = f"blocks_recipes.{package.replace('-', '_')}.{path.stem}"
        if module_name in sys.modules:
            continue
        try:
            _import_file(module_name, path)
        except (Exception, SystemExit) as exc:  # a file that exits at import is a load problem too
            problem = LoadProblem(
                path.resolve(), describe_exception(exc), _declared_recipes(path), _line_in(exc, path)
            )
            problems.append(_record(problem))
    return problems


def _import_file(module_name: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise


def _declared_recipes(path: Path) -> tuple[str, ...]:
    try:
        return tuple(_RECIPE_DECORATOR.findall(path.read_text(errors="replace")))
    except OSError:
        return ()


def _first_line(fn: Any) -> int | None:
    """The line of *fn*'s ``def`` (a call with the wrong arguments raises before its body runs)."""
    code = getattr(fn, "__code__", None)
    return code.co_firstlineno if code is not None else None


def _line_in(exc: BaseException, path: Path) -> int | None:
    """The last line of *path* in the traceback of *exc* (or of its syntax error)."""
    if isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename).resolve() == path.resolve():
        return exc.lineno
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if Path(frame.f_code.co_filename).resolve() == path.resolve():
            line = lineno
    return line


def register_configs(found: project.Project | None = None) -> None:
    """Make every recipe of the current catalog an option and write the catalog into Hydra's ConfigStore.

    For code that registers blocks or recipes after the catalog was built (tests, notebooks);
    *found* is kept for compatibility (the catalog knows its project).
    """
    catalog = current()
    catalog.make_recipes()
    catalog.install()


def project_presets(catalog: Catalog, conf: Path) -> list[Preset]:
    """Each ``conf/<group>/<name>.yaml`` of the project as option ``<group>=<name>``.

    An option of that name already in the group (blocks' own YAML preset, a block, a recipe's
    preset, a package's or another project conf dir's preset) is an error naming both files.
    """
    for group in GROUPS:
        directory = conf / group
        for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
            taken = option_source(catalog, group, path.stem)
            if taken is not None:
                raise project.clash(f"preset {group}={path.stem}", taken, str(path))
    return package_presets("", conf, catalog.registry)


def option_source(catalog: Catalog, group: str, name: str) -> str | None:
    """Where option *name* of *group* comes from (a file), or None when the name is free."""
    for preset in catalog.presets:
        if (preset.group, preset.option) == (group, name):
            return str(preset.path)
    for conf in _shipped_conf_dirs():
        yaml = conf / group / f"{name}.yaml"
        if yaml.is_file():
            return str(yaml)
    if group in REGISTRY_KINDS and name in catalog.registry.names(group):
        cls = catalog.registry.get(group, name).cls
        return f"{cls.__module__}.{cls.__qualname__} ({_class_file(cls)})"
    recipes = {e.name for e in catalog.recipes.entries()}
    if name in recipes and (group == "recipe" or catalog.customizes(name, group)):
        return f"recipe {name} ({catalog.recipes.get(name).file})"
    return None


def _class_file(cls: type) -> str:
    try:
        return inspect.getsourcefile(cls) or cls.__module__
    except TypeError:
        return cls.__module__


def package_presets(namespace: str, conf: Path, registry: Registry) -> list[Preset]:
    """Each ``conf/<group>/<name>.yaml`` of a package as option ``<group>=<namespace>/<name>``.

    With an empty *namespace* (the user's project) the option is ``<group>=<name>``.

    A preset that names its block (``_block_: resnet``, or ``acme/resnet``) is merged onto that
    block's typed node, so overriding one of its fields is checked like any block's. A file
    that cannot be read is recorded as a :class:`LoadProblem` and skipped.
    """
    from omegaconf import OmegaConf

    from blocks.compat.hydra_private import config_header

    found = []
    for group in GROUPS:
        directory = conf / group
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.yaml")):
            option = f"{namespace}/{path.stem}" if namespace else path.stem
            try:
                text = path.read_text()
                header = config_header(text)
                node = OmegaConf.load(path)
                if not isinstance(node, DictConfig):
                    raise RegistryError(f"{path} holds a list, not a mapping of config keys")
                block = node.get("_block_") if group in REGISTRY_KINDS else None
                if block is not None:
                    name = _preset_block(registry, group, namespace, str(block))
                    node["_block_"] = name
                    typed = block_node(registry.get(group, name).cls())
                    node = OmegaConf.merge(typed, node)
                found.append(Preset(group, option, node, header.get("package"), path))
            except Exception as exc:
                _record(LoadProblem(path.resolve(), describe_exception(exc), (option,), group=group))
    return found


def _preset_block(registry: Registry, group: str, namespace: str, block: str) -> str:
    """The block a package's preset names with ``_block_``: its own ``namespace/block`` first, then the full name."""
    if "/" in block or not namespace:
        return block
    own = f"{namespace}/{block}"
    return block if own not in registry.names(group) and block in registry.names(group) else own
