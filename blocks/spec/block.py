"""The block base class: a frozen, typed dataclass that is also a Hydra structured config."""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from blocks.spec.kinds import KINDS as KINDS

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext
    from blocks.spec.imports import Kind

BlockT = typing.TypeVar("BlockT", bound="Block")


@dataclass(frozen=True, kw_only=True)
class Block:
    """Base of every block.

    A block is a frozen dataclass with typed fields that all have defaults; it holds no
    torch objects. Each kind (``data``, ``model``, ...) has its own base class in its own
    sub-package that says what a block of that kind must provide; ``build`` methods import
    torch lazily so that planning stays torch-free.
    """

    kind: ClassVar[str] = ""
    """The config group this block belongs to; set on each kind's base class."""

    block_name: ClassVar[str] = ""
    """The registered name (``transformer``, ``acme/resnet``); set by ``register``."""

    def check(self, ctx: CheckContext) -> None:
        """Report this block's problems and its contracts with the other blocks.

        Use ``ctx.error(field, message, fix)`` and ``ctx.warning(...)``; read the other
        blocks and the derived numbers from ``ctx``. The default checks nothing.
        """

    def import_paths(self) -> list[tuple[str, str, Kind]]:
        """Every import path this block's fields name, as ``(config key, path, kind it must be)``.

        Blocks that name code by path (adapters, loggers) list it here, so that ``blocks run``
        imports and checks each one through :mod:`blocks.spec.imports` before anything starts.
        The default names none.
        """
        return []

    def replace(self: BlockT, **changes: Any) -> BlockT:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def summary(cls) -> str:
        """The first line of the block's docstring."""
        doc = (cls.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


def non_finite_fields(block: Block) -> list[tuple[str, float]]:
    """The float fields of *block* that hold NaN or an infinity, which pass every ``<``/``>`` check.

    Read from the field types, so every block of every kind gets this check without code of its own.
    """
    hints = typing.get_type_hints(type(block))
    out = []
    for f in dataclasses.fields(block):
        value = getattr(block, f.name)
        if _is_float_type(hints.get(f.name)) and isinstance(value, float) and not math.isfinite(value):
            out.append((f.name, value))
    return out


def _is_float_type(annotation: Any) -> bool:
    if annotation is float:
        return True
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and float in typing.get_args(
        annotation
    )


@dataclass(frozen=True)
class FieldInfo:
    """A block field as `blocks list` and the docs show it."""

    name: str
    type: str
    default: Any
    doc: str


_ATTR_LINE = re.compile(r"^\s{4,}(\w+)(?:\s*\(.*?\))?:\s*(.*)$")


def _attribute_docs(cls: type) -> dict[str, str]:
    """Field docs from the ``Attributes:`` sections of the class and its bases (Google style)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        text = klass.__dict__.get("__doc__") or ""
        in_section = False
        current = ""
        for line in text.splitlines():
            stripped = line.strip()
            if stripped in ("Attributes:", "Args:"):
                in_section = True
                continue
            if not in_section:
                continue
            if not stripped:
                current = ""
                continue
            match = _ATTR_LINE.match(line)
            if match and len(line) - len(line.lstrip()) <= 8:
                current = match.group(1)
                docs[current] = match.group(2).strip()
            elif current:
                docs[current] += " " + stripped
            elif not line.startswith(" "):
                in_section = False
    return docs


def type_name(tp: Any) -> str:
    """A short readable name for a type annotation (``int``, ``float | None``, ``tuple[int, ...]``)."""
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    text = str(tp).replace("typing.", "")
    return re.sub(r"Optional\[(.*)\]", r"\1 | None", text)


def block_fields(cls: type[Block]) -> list[FieldInfo]:
    """The fields of a block class with their types, defaults and docs."""
    hints = typing.get_type_hints(cls)
    docs = _attribute_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "???"
        out.append(FieldInfo(f.name, type_name(hints.get(f.name, Any)), default, docs.get(f.name, "")))
    return out
