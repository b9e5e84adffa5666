"""Loading everything that can be composed: built-in blocks, shipped recipes, config groups.

A recipe file that raises when it is imported, or a recipe that raises when it is called, is
skipped and recorded as a :class:`LoadProblem`: the rest of the catalog still loads, the CLI
shows each problem as a warning, and choosing a recipe that could not load names the file.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from blocks.compat.hydra_private import share_config_store
from blocks.core import packages, paths, project
from blocks.core.compose import GROUPS, block_node, primary_node, store_option
from blocks.core.launcher import RAY_LAUNCHER_NODE
from blocks.core.pipeline import Pipeline
from blocks.core.recipe import RECIPES, RecipeEntry
from blocks.spec.block import KINDS as REGISTRY_KINDS
from blocks.spec.errors import DuplicateName, Problem, RegistryError, describe_exception
from blocks.spec.kinds import KIND_TABLE
from blocks.spec.registry import REGISTRY

if TYPE_CHECKING:
    from hydra.core.config_store import ConfigStore

BUILTIN_KINDS = tuple(kind.package for kind in KIND_TABLE)
"""The packages whose import registers the built-in blocks (from the kind table)."""

_loaded = False
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
    """

    path: Path
    message: str
    recipes: tuple[str, ...] = ()
    line: int | None = None
    during: Literal["import", "call"] = "import"

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
            "recipe",
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
    packages.discover()
    found = project.find()
    load_project_recipes(found.recipes)
    register_configs(found)
    _loaded = True


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
            except Exception as exc:
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
        for entry in RECIPES.entries():
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
        except Exception as exc:
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
    """Store every block and recipe in Hydra's ConfigStore, plus the primary config.

    The presets of *found* (the user's project) are stored beside blocks' own, under their
    plain names (``optim=fastsgd``).
    """
    from hydra.core.config_store import ConfigStore

    share_config_store()
    store = ConfigStore.instance()
    for entry in REGISTRY.entries():
        store_option(store, entry.kind, entry.name, block_node(entry.cls()))
    for recipe_entry in RECIPES.entries():
        try:
            _register_recipe(store, recipe_entry)
        except Exception as exc:
            source = inspect.getsourcefile(recipe_entry.fn)
            path = Path(source).resolve() if source else Path(recipe_entry.source)
            _record(
                LoadProblem(path, describe_exception(exc), (recipe_entry.name,), _line_in(exc, path), "call")
            )
    for package in packages.packages():
        if package.conf is not None:
            register_package_presets(store, package.namespace, package.conf)
    for conf_dir in found.conf if found is not None else ():
        register_project_presets(store, conf_dir)
    store.store(group="hydra/launcher", name="ray", node=RAY_LAUNCHER_NODE)
    conf = paths.conf_dir()
    store.store(name="blocks", node=primary_node([str(conf)] if conf else []))


def _register_recipe(store: ConfigStore, recipe_entry: RecipeEntry) -> None:
    """Store a recipe as an option of the ``recipe`` group, and each block it customizes as a preset."""
    made = recipe_entry.make()
    if isinstance(made, Pipeline):
        return  # a pipeline is no config option: `blocks run` runs its stages (blocks.launch.pipeline)
    recipe = made
    defaults = []
    presets = []
    for kind, block in recipe.blocks().items():
        option = block.block_name
        if block != type(block)():
            option = recipe_entry.name
            if option in REGISTRY.names(kind):
                raise RegistryError(
                    f"recipe '{option}' customizes its {kind} block, and its preset would shadow the "
                    f"{kind} block '{option}'; rename the recipe"
                )
            presets.append((kind, block_node(block)))
        defaults.append({f"override /{kind}": option})
    for kind, node in presets:
        store_option(store, kind, recipe_entry.name, node)
    store_option(store, "recipe", recipe_entry.name, {"defaults": defaults}, package="_global_")


def register_project_presets(store: ConfigStore, conf: Path) -> None:
    """Store each ``conf/<group>/<name>.yaml`` of the project as option ``<group>=<name>``.

    An option of that name already in the group (blocks' own YAML preset, a block, a recipe or
    its preset, another project conf dir) is an error naming both files.
    """
    for group in GROUPS:
        directory = conf / group
        for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
            taken = option_source(group, path.stem, store)
            if taken is not None:
                raise project.clash(f"preset {group}={path.stem}", taken, str(path))
            _project_presets[(group, path.stem)] = path
    register_package_presets(store, "", conf)


_project_presets: dict[tuple[str, str], Path] = {}


def option_source(group: str, name: str, store: ConfigStore | None = None) -> str | None:
    """Where option *name* of *group* comes from (a file), or None when the name is free."""
    if (group, name) in _project_presets:
        return str(_project_presets[(group, name)])
    for conf in _shipped_conf_dirs():
        yaml = conf / group / f"{name}.yaml"
        if yaml.is_file():
            return str(yaml)
    if store is not None and f"{name}.yaml" not in store.repo.get(group, {}):
        return None
    if group in REGISTRY_KINDS and name in REGISTRY.names(group):
        cls = REGISTRY.get(group, name).cls
        return f"{cls.__module__}.{cls.__qualname__} ({_class_file(cls)})"
    for entry in RECIPES.entries():
        if entry.name == name:
            return f"recipe {name} ({entry.file})"
    return None if store is None else f"option {group}={name} of blocks' config store"


def _class_file(cls: type) -> str:
    try:
        return inspect.getsourcefile(cls) or cls.__module__
    except TypeError:
        return cls.__module__


def register_package_presets(store: ConfigStore, namespace: str, conf: Path) -> None:
    """Store each ``conf/<group>/<name>.yaml`` of a package as option ``<group>=<namespace>/<name>``.

    With an empty *namespace* (the user's project) the option is ``<group>=<name>``.

    A preset that names its block (``_block_: resnet``, or ``acme/resnet``) is merged onto that
    block's typed node, so overriding one of its fields is checked like any block's. A file
    that cannot be read is recorded as a :class:`LoadProblem` and skipped.
    """
    from omegaconf import DictConfig, OmegaConf

    from blocks.compat.hydra_private import config_header

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
                    name = str(block) if "/" in str(block) or not namespace else f"{namespace}/{block}"
                    node["_block_"] = name
                    typed = block_node(REGISTRY.get(group, name).cls())
                    node = OmegaConf.merge(typed, node)
                store_option(store, group, option, node, package=header.get("package"))
            except Exception as exc:
                _record(LoadProblem(path.resolve(), describe_exception(exc), (option,)))
