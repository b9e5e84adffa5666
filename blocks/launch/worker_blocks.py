"""Refuse, before a multi-process launch, a chosen block its worker processes could not load.

Worker processes (torchrun's, Ray's) compose the run's ``config.yaml`` again from the blocks
they load themselves: blocks' own, installed packages' and the project's recipe files
(:func:`blocks.core.catalog.load`). A block registered by the launching Python program itself,
in ``__main__`` or in a module only that program imports, exists in the driver alone: its
workers would fail with "no model block named ...". This module asks a fresh interpreter,
started as a worker is (same ``sys.executable``, working directory and environment), which of
the chosen blocks it finds, so a block the workers do load (a module a project recipe file
imports, say) is not refused.

Refusing was chosen over making workers import the recorded module: ``__main__`` cannot be
imported again without running the program, and whether another module imports in a worker
depends on a ``sys.path`` the driver cannot see; a refusal before anything starts is exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping

from blocks.spec.block import Block
from blocks.spec.errors import ConfigError, Problem
from blocks.spec.imports import PROJECT_MODULE
from blocks.spec.registry import target_of

_FIND_IN_A_WORKER = """
import json, sys
from blocks.core.catalog import default_catalog
registry = default_catalog().registry
wanted = json.loads(sys.argv[1])
found = {kind: {e.name: e.target for e in registry.entries() if e.kind == kind} for kind in wanted}
print(json.dumps([kind for kind, (name, target) in wanted.items() if found[kind].get(name) != target]))
"""

LOADS_ITSELF = ("blocks.", "blocks_recipes.", f"{PROJECT_MODULE}.")
"""Module prefixes of the blocks every worker loads: blocks' own, shipped recipes', the project's."""


def _launching_program_blocks(blocks: Mapping[str, Block]) -> dict[str, tuple[str, str]]:
    """The chosen blocks by kind that the launching program may have registered: ``(name, module:Class)``.

    A package's block is namespaced (``acme/resnet``): its workers load it as the driver did.
    """
    return {
        kind: (type(block).block_name, target_of(type(block)))
        for kind, block in blocks.items()
        if not type(block).__module__.startswith(LOADS_ITSELF) and "/" not in type(block).block_name
    }


def _missing_in_a_worker(wanted: dict[str, tuple[str, str]]) -> list[str]:
    """The kinds of *wanted* whose block a fresh worker-like interpreter does not register with the same class."""
    done = subprocess.run(
        [sys.executable, "-c", _FIND_IN_A_WORKER, json.dumps(wanted)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return list(wanted)  # the catalog did not load: no worker would find them either
    missing: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return missing


def refuse_blocks_workers_cannot_load(blocks: Mapping[str, Block]) -> None:
    """Raise :class:`ConfigError` naming each chosen block the worker processes would not find.

    Call it before a launch that starts other processes; it starts a Python interpreter only
    when a chosen block is neither blocks' own, a package's nor the project's.
    """
    wanted = _launching_program_blocks(blocks)
    if not wanted:
        return
    problems = [
        Problem(
            kind,
            f"{kind} block '{name}' ({target}) is registered by this program only; the worker processes "
            "of a multi-process or restartable run load only blocks' own blocks, installed packages and "
            "the project's recipe files, so they would not find it",
            "put the block in a recipes dir ([tool.blocks] recipes, --recipes, BLOCKS_PATH) or a package "
            "so worker processes can load it, or train in this process (one device, trainer.max_failures=0)",
            check="worker-blocks",
        )
        for kind in _missing_in_a_worker(wanted)
        for name, target in [wanted[kind]]
    ]
    if problems:
        raise ConfigError(problems)
