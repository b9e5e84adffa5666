"""A block's own code that raises while blocks plans with it: a problem naming the block and whom to ask.

A block's plan-time methods (``check``, ``num_parameters``, ``batch_spec``, ...) are code of
the team that wrote the block, often another team's package. When one raises, the plan
reports it on the block's kind, with the block's distribution and version and the line that
raised, instead of ending the command with a traceback.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from types import FrameType

from blocks.spec.block import Block
from blocks.spec.errors import Problem, RegistryError
from blocks.spec.manifest import BUILTIN_BLOCKS
from blocks.spec.registry import PROJECT_PACKAGE, REGISTRY, Entry, active_registry, target_of


def raised_at(exc: BaseException) -> str:
    """``Type: message in function() at file:line``: the exception and the frame that raised it."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" in {frames[-1].name}() at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}{': ' + text if text else ''}{where}"


def raised_in_block(exc: BaseException, blocks: Mapping[str, Block]) -> Problem | None:
    """The problem for *exc* when a method of one of *blocks* raised it (None when none of them is on its traceback).

    The innermost method of a block on the traceback is the one blamed: when it is code of
    blocks itself (a base class's ``check`` a package's block reached with ``super()``), blocks
    is named first, with the block's maintainers (the subclass may hand it a value it cannot take).
    """
    kind, method = None, None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        receiver = frame.f_locals.get("self", frame.f_locals.get("cls"))
        for candidate, block in blocks.items():
            if receiver is block or receiver is type(block):
                kind, method = candidate, frame
    if kind is None or method is None:
        return None
    block = blocks[kind]
    entry = _entry(kind, block)
    target = target_of(type(block))
    in_blocks = _is_blocks_code(method)
    if BUILTIN_BLOCKS.get(kind, {}).get(block.block_name) == target:
        made_by, ask = "blocks", "this is a bug in blocks: report it"
    elif entry is not None and entry.package not in ("blocks", PROJECT_PACKAGE):
        made_by = f"{entry.package} {entry.version}".strip()
        ask = f"report it to the maintainers of {entry.package} (with this message)"
    else:  # a project's own block, or one a script registered
        made_by, ask = target, f"fix {target}"
    if in_blocks and made_by != "blocks" and isinstance(exc, NotImplementedError):
        name = _method_name(method, block).rsplit(".", 1)[-1]
        return Problem(
            key=kind,
            message=f"{kind} block '{block.block_name}' ({target}, from {made_by}) does not define {name}(), "
            f"which every {kind} block must: blocks' base class has none to fall back on",
            fix=f"define {name}() in {target} (see the docs: Write a block), or choose another {kind} block",
            check="block-raised",
        )
    where = ""
    if in_blocks and made_by != "blocks":
        # blocks' base-class code, reached through super(): a bug in blocks, or a value of the
        # subclass that code cannot take (a field retyped, a property overridden): both are told
        where = f" in blocks' own {_method_name(method, block)}()"
        whose = (
            f"report it to blocks and to the maintainers of {entry.package}"
            if ask.startswith("report") and entry
            else f"check {target}, or report it to blocks"
        )
        ask = f"this is a bug in blocks or a value of this block blocks' code cannot take: {whose}"
    return Problem(
        key=kind,
        message=f"{kind} block '{block.block_name}' (from {made_by}) raised {raised_at(exc)}{where} while planning",
        fix=f"{ask}, or choose another {kind} block (`blocks list {kind}`)",
        check="block-raised",
    )


def _method_name(frame: FrameType, block: Block) -> str:
    """``Class.method`` of the method of *block* that *frame* runs (the class of its MRO that defines it)."""
    code = frame.f_code
    for cls in type(block).__mro__:
        function = vars(cls).get(code.co_name)
        function = getattr(function, "__func__", getattr(function, "fget", function))
        if getattr(function, "__code__", None) is code:
            return f"{cls.__name__}.{code.co_name}"
    return code.co_name


def _is_blocks_code(frame: FrameType) -> bool:
    """Whether *frame* runs a function of the blocks package itself (not of a package or project built on it)."""
    module = str(frame.f_globals.get("__name__", ""))
    return module == "blocks" or module.startswith("blocks.")


def _entry(kind: str, block: Block) -> Entry | None:
    for registry in (active_registry(), REGISTRY):
        try:
            return registry.get(kind, block.block_name)
        except RegistryError:
            continue
    return None
