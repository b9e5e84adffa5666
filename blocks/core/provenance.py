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

from blocks.spec.block import Block
from blocks.spec.errors import RegistryError
from blocks.spec.manifest import BUILTIN_BLOCKS
from blocks.spec.registry import active_registry

SOURCES_KEY = "packages"
"""The key of ``plan.json`` and ``model.json`` that records each kind's block distribution and version."""


def block_sources(blocks: Mapping[str, Block]) -> dict[str, dict[str, str]]:
    """Each kind's ``{"block", "distribution", "version"}``: its package's, or blocks' own for a built-in.

    A block of no versioned distribution (a project's own file) is left out.
    """
    # the top-level package is imported with this module; importing its name would load its lazy exports
    own = sys.modules["blocks"].__version__
    sources = {}
    for kind, block in blocks.items():
        try:
            entry = active_registry().get(kind, block.block_name)
        except RegistryError:
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
        if not isinstance(was, Mapping) or was.get("block") != now["block"]:
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
