"""Which distribution, at which version, provided each block of a run, and the notes when that changed.

``plan.json`` (``packages``) and an export's ``model.json`` record it per kind. A later eval,
export, ``load_model`` or resume compares it with what is installed: another version of a
block's code may compute otherwise with the same fields, so each difference is said in one
line. It is a note, not a refusal: most upgrades are fixes, and the user decides.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

from blocks.spec.block import Block
from blocks.spec.errors import ConfigError, Problem, RegistryError
from blocks.spec.manifest import BUILTIN_BLOCKS
from blocks.spec.registry import PROJECT_PACKAGE, active_registry

SOURCES_KEY = "packages"
"""The key of ``plan.json`` and ``model.json`` that records each kind's block distribution and version."""


PROJECT_KEY = "project"
"""The key of a kind's ``packages`` record that names the project recipe file its block came from."""


def block_sources(blocks: Mapping[str, Block]) -> dict[str, dict[str, str]]:
    """Each kind's ``{"block", "distribution", "version"}``: its package's, or blocks' own for a built-in.

    A block of the project's own recipe files is ``{"block", "project": <its file>}``, so a
    later eval elsewhere can say where it is (:func:`refuse_project_blocks_not_loaded`). Any
    other block of no versioned distribution (one a Python program registers) is left out.
    """
    # the top-level package is imported with this module; importing its name would load its lazy exports
    own = sys.modules["blocks"].__version__
    sources = {}
    for kind, block in blocks.items():
        try:
            entry = active_registry().get(kind, block.block_name)
        except RegistryError:
            continue
        if entry.package == PROJECT_PACKAGE:
            sources[kind] = {"block": entry.name, PROJECT_KEY: _defining_file(type(block))}
            continue
        version = entry.version
        if entry.package == "blocks" and BUILTIN_BLOCKS.get(kind, {}).get(entry.name) == entry.target:
            version = own
        if version:
            sources[kind] = {"block": entry.name, "distribution": entry.package, "version": version}
    return sources


def version_notes(
    recorded: object, blocks: Mapping[str, Block], what: str = "the run used", lead: str = "note: "
) -> list[str]:
    """One line per distribution whose blocks *recorded* names at another version than the installed one.

    *recorded* is the ``packages`` value of a ``plan.json`` or ``model.json`` (nothing is said
    when it is absent: a run written before versions were recorded); a kind whose block is
    another one now (``blocks eval data=...``) is not compared. The line lists the blocks
    concerned (``model=acme/net, data=acme/images``).
    """
    if not isinstance(recorded, Mapping):
        return []
    changed: dict[tuple[str, str, str, str], list[str]] = {}
    for kind, now in block_sources(blocks).items():
        was = recorded.get(kind)
        if not isinstance(was, Mapping) or was.get("block") != now["block"] or PROJECT_KEY in {*now, *was}:
            continue
        if was.get("distribution") != now["distribution"] or was.get("version") != now["version"]:
            versions = (
                str(was.get("distribution")),
                str(was.get("version")),
                now["distribution"],
                now["version"],
            )
            changed.setdefault(versions, []).append(f"{kind}={now['block']}")
    return [
        f"{lead}{', '.join(chosen)}: {what} {old} {old_version}, {new} {new_version} is installed; its code "
        f"may compute otherwise (install {old}=={old_version} to reproduce the run exactly)"
        for (old, old_version, new, new_version), chosen in changed.items()
    ]


def recorded_sources(text: str) -> object:
    """The ``packages`` value of a ``plan.json`` or ``model.json`` text (None when absent or unreadable)."""
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found.get(SOURCES_KEY) if isinstance(found, dict) else None


def _defining_file(cls: type) -> str:
    """The file that defines *cls* (a project recipe file), else its module's name."""
    module = sys.modules.get(cls.__module__)
    return str(Path(module.__file__).resolve()) if module is not None and module.__file__ else cls.__module__


def refuse_project_blocks_not_loaded(recorded: object, chosen: Mapping[str, str]) -> None:
    """Raise :class:`ConfigError` for each chosen block that *recorded* says came from a project's recipe file and that is not loaded here.

    *recorded* is the ``packages`` value of a ``plan.json`` or ``model.json``; *chosen* maps
    each kind to its block's name. Such a run, read from outside its project (``blocks eval``,
    ``blocks export``, :func:`blocks.load_model`), would otherwise get "no model block named ..."
    and the fix of choosing another block.
    """
    if not isinstance(recorded, Mapping):
        return
    problems = []
    for kind, name in chosen.items():
        was = recorded.get(kind)
        if not isinstance(was, Mapping) or was.get("block") != name or PROJECT_KEY not in was:
            continue
        if name in active_registry().names(kind):
            continue
        path = Path(str(was[PROJECT_KEY]))
        problems.append(
            Problem(
                kind,
                f"{kind} block '{name}' is a project's own, from its recipe file {path}, which is not loaded here",
                f"run from the project that defines it ({path}), or pass --recipes {path.parent} "
                f"(or set BLOCKS_PATH={path.parent})",
                check="unknown-option",
            )
        )
    if problems:
        raise ConfigError(problems)
