"""The user's project: recipe files and YAML presets found where ``blocks`` runs, without packaging.

A project says where they are in the ``[tool.blocks]`` table of its ``pyproject.toml`` (the
nearest one above the working directory; paths are relative to that file)::

    [tool.blocks]
    recipes = ["recipes/"]   # *.py files whose @recipe functions (and @register blocks) load
    conf = ["conf/"]         # <group>/<name>.yaml presets: optim=fastsgd, experiment=..., recipe=...

More recipe directories come from ``BLOCKS_PATH`` (``os.pathsep``-separated) and from
``blocks --recipes DIR``, which sets ``BLOCKS_PATH`` so the processes a run starts see them too.

Project recipe files are imported as modules of the package :data:`MODULE` (``recipes/mine.py``
is ``blocks_project.mine``), so a file can import its neighbours and a config can name a class
defined in one (``model.target=blocks_project.mine.TinyNet``): the import seam admits
:data:`MODULE` as it admits an installed block package's module. Importing them runs the
project's own code, as pytest runs a ``conftest.py``.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from blocks.spec.errors import ConfigError, Problem
from blocks.spec.imports import PROJECT_MODULE, nearest_pyproject

ENV_VAR = "BLOCKS_PATH"
MODULE = PROJECT_MODULE
TABLE = "tool.blocks"


@dataclass(frozen=True)
class Project:
    """Where the project's recipe files and presets are.

    Attributes:
        pyproject: the ``pyproject.toml`` whose ``[tool.blocks]`` table named them (None when
            they come only from ``BLOCKS_PATH``).
        recipes: directories of recipe files, in the order searched.
        conf: directories of ``<group>/<name>.yaml`` presets.
    """

    pyproject: Path | None
    recipes: tuple[Path, ...]
    conf: tuple[Path, ...]

    @property
    def empty(self) -> bool:
        """Whether the project adds nothing."""
        return not self.recipes and not self.conf


def find(cwd: Path | None = None) -> Project:
    """The project of *cwd* (default: the working directory) plus ``BLOCKS_PATH``; raises on a bad table."""
    recipes: list[Path] = []
    conf: list[Path] = []
    pyproject = nearest_pyproject(cwd or Path.cwd())
    table = _table(pyproject) if pyproject is not None else {}
    if pyproject is not None and table:
        recipes += _dirs(pyproject, table, "recipes")
        conf += _dirs(pyproject, table, "conf")
    for entry in os.environ.get(ENV_VAR, "").split(os.pathsep):
        if not entry.strip():
            continue
        path = Path(entry).expanduser().resolve()
        if not path.is_dir():
            raise ConfigError(
                Problem(
                    ENV_VAR,
                    f"{ENV_VAR} names {path}, which is not a directory of recipe files",
                    f"point {ENV_VAR} (or --recipes) at a directory of *.py recipe files",
                    check="project-config",
                )
            )
        if path not in recipes:
            recipes.append(path)
    return Project(pyproject if table else None, tuple(recipes), tuple(conf))


def _table(pyproject: Path) -> dict[str, object]:
    import tomllib

    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            Problem(
                TABLE, f"{pyproject} could not be read: {exc}", f"correct {pyproject}", check="project-config"
            )
        ) from None
    table = data.get("tool", {}).get("blocks", {})
    return table if isinstance(table, dict) else {}


def _dirs(pyproject: Path, table: dict[str, object], key: str) -> list[Path]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            Problem(
                f"{TABLE}.{key}",
                f"{pyproject}: [tool.blocks] {key} must be a list of directories, got {value!r}",
                f'{key} = ["{key}/"] (relative to {pyproject.name})',
                check="project-config",
            )
        )
    found = []
    for entry in value:
        path = (pyproject.parent / entry).resolve()
        if not path.is_dir():
            raise ConfigError(
                Problem(
                    f"{TABLE}.{key}",
                    f"{pyproject}: [tool.blocks] {key} names {entry!r}, and {path} is not a directory",
                    f"create {path}, or correct the entry (paths are relative to {pyproject})",
                    check="project-config",
                )
            )
        found.append(path)
    return found


def install_module(recipe_dirs: tuple[Path, ...]) -> None:
    """Make :data:`MODULE` a package whose modules are the files of *recipe_dirs*."""
    module = sys.modules.get(MODULE)
    if module is None:
        module = types.ModuleType(MODULE, "The recipe files of the project blocks runs in.")
        module.__path__ = []
        sys.modules[MODULE] = module
        importlib.invalidate_caches()
    for directory in recipe_dirs:
        if str(directory) not in module.__path__:
            module.__path__.append(str(directory))


def module_name(path: Path) -> str:
    """The module a project recipe file is imported as (``blocks_project.<stem>``)."""
    return f"{MODULE}.{path.stem}"


def clash(what: str, first: str, second: str) -> ConfigError:
    """The error for two definitions of one name, naming both files."""
    return ConfigError(
        Problem(
            "project",
            f"{what} is defined twice: in {first} and in {second}",
            "rename the project's one (recipe and preset names share one namespace with blocks' own "
            "and with those of installed packages)",
            check="name-clash",
        )
    )
