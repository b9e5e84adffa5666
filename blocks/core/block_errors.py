"""A block's own code that raises while blocks plans with it: a problem naming the block and whom to ask.

A block's plan-time methods (``check``, ``num_parameters``, ``batch_spec``, ...) are code of
the team that wrote the block, often another team's package. When one raises, the plan
reports it on the block's kind, with the block's distribution and version and the line that
raised, instead of ending the command with a traceback.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping

from blocks.spec.block import Block
from blocks.spec.errors import Problem, RegistryError
from blocks.spec.registry import REGISTRY, Entry, active_registry


def raised_at(exc: BaseException) -> str:
    """``Type: message in function() at file:line``: the exception and the frame that raised it."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" in {frames[-1].name}() at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}{': ' + text if text else ''}{where}"


def raised_in_block(exc: BaseException, blocks: Mapping[str, Block]) -> Problem | None:
    """The problem for *exc* when a method of one of *blocks* raised it (None when none of them is on its traceback)."""
    kind = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        receiver = frame.f_locals.get("self", frame.f_locals.get("cls"))
        for candidate, block in blocks.items():
            if receiver is block or receiver is type(block):
                kind = candidate
    if kind is None:
        return None
    block = blocks[kind]
    entry = _entry(kind, block)
    package, version = (entry.package, entry.version) if entry else (type(block).__module__, "")
    made_by = f"{package} {version}".strip()
    ask = (
        "this is a bug in blocks: report it"
        if package == "blocks"
        else f"report it to the maintainers of {package} (with this message)"
    )
    return Problem(
        key=kind,
        message=f"{kind} block '{block.block_name}' (from {made_by}) raised {raised_at(exc)} while planning",
        fix=f"{ask}, or choose another {kind} block (`blocks list {kind}`)",
        check="block-raised",
    )


def _entry(kind: str, block: Block) -> Entry | None:
    for registry in (active_registry(), REGISTRY):
        try:
            return registry.get(kind, block.block_name)
        except RegistryError:
            continue
    return None
