"""Command-line overrides checked one by one with Hydra's own parser, before anything composes.

Hydra parses every override at once and reports a grammar error without saying which one
failed; it adds unknown keys at the root (``+foo=1``) without complaint; and a list given to a
config group (``strategy=[1,2]``) fails deep inside its defaults list. Parsing each override
alone with :class:`hydra.core.override_parser.overrides_parser.OverridesParser` names the
override, its key and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from blocks.core import paths
from blocks.spec.block import KINDS
from blocks.spec.errors import ConfigError, Problem, did_you_mean
from blocks.spec.kinds import CROSS_KIND_GROUPS
from blocks.spec.registry import active_registry

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

_GROUPS = (*KINDS, *CROSS_KIND_GROUPS)
SEARCHPATH_KEY = "hydra.searchpath"
PKG_SCHEME = "pkg://"


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _quoted(key: str, value: str) -> str:
    """The override with its value quoted for Hydra, the whole quoted again for a POSIX shell."""
    inner = f"'{value}'" if "'" not in value else f'"{value}"'
    outer = '"' if "'" in inner and '"' not in inner else "'"
    if outer == "'" and "'" in inner:
        return f"{key}={inner}"
    return f"{outer}{key}={inner}{outer}"


def _parse_problem(override: str, exc: Exception) -> Problem:
    """A grammar error of one override: it names the override, its key, and how to quote the value."""
    text = str(getattr(exc, "message", "") or exc)
    lines = [
        line
        for line in text.splitlines()
        if line.strip() not in ("", "^") and not line.startswith(("See https://", "Error parsing override"))
    ]
    detail = lines[0] if lines else type(exc).__name__
    if detail.startswith("LexerNoViableAltException"):
        detail = "a character the override grammar cannot read (an unclosed quote or a stray symbol)"
    key, sep, value = override.partition("=")
    key = key.lstrip("+~")
    if sep and key:
        fix = f"quote a value with special characters: {_quoted(key, value)}"
    else:
        fix = "write an override as key=value, e.g. optim.lr=3e-4"
    return Problem(
        key or override,
        f"cannot parse the override '{override}': {detail}",
        fix,
        check="override-syntax",
    )


def _root_key_problem(key: str) -> Problem:
    """``+foo=1``, ``+max_steps=3``: a key at the root of the config, which no block reads."""
    kinds = [
        kind for kind in KINDS if any(key in _field_names(e.cls) for e in active_registry().entries(kind))
    ]
    if kinds:
        hint = " or ".join(f"'{kind}.{key}'" for kind in kinds)
        fix = " or ".join(f"{kind}.{key}=..." for kind in kinds)
    else:
        fields = {
            f"{kind}.{name}"
            for kind in KINDS
            for e in active_registry().entries(kind)
            for name in _field_names(e.cls)
        }
        by_name = {candidate.split(".", 1)[1]: candidate for candidate in sorted(fields)}
        close = did_you_mean(key, [*_GROUPS, *by_name])
        names = [name for name in close.split("'")[1::2]]
        hint = " or ".join(f"'{by_name.get(name, name)}'" for name in names)
        fix = (
            f"{by_name.get(names[0], names[0])}=..."
            if names
            else "set a key of a config group: <group>.<key>=..."
        )
    return Problem(
        key,
        f"'{key}' is not a config group or a key of one; nothing reads it"
        + (f"; did you mean {hint}?" if hint else ""),
        fix + f" (config groups: {', '.join(_GROUPS)})",
        check="unknown-group",
    )


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _parsed(overrides: Sequence[str]) -> Iterator[tuple[str, Override | None, Problem | None]]:
    """Each override with Hydra's parse of it alone, or the problem that names why it does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parsed = parser.parse_overrides([override])[0]
        except HydraException as exc:
            yield override, None, _parse_problem(override, exc)
            continue
        yield override, parsed, None if parsed.key_or_group else _keyless_problem(override)


def syntax_problems(overrides: Sequence[str]) -> list[Problem]:
    """A problem for each override Hydra's grammar cannot parse, or that has no key, naming it."""
    return [problem for _, _, problem in _parsed(overrides) if problem is not None]


def _keyless_problem(override: str) -> Problem:
    return Problem(
        override,
        f"the override '{override}' has no key",
        "write an override as key=value, e.g. optim.lr=3e-4",
        check="override-syntax",
    )


def check_overrides(overrides: Sequence[str]) -> tuple[list[str], list[Problem]]:
    """The overrides that parse and make sense on their own, and a problem for each of the others.

    Checked here: Hydra's grammar (per override, naming it), an override without a key, a
    config group given something other than one option name, and a new key at the root of the
    config (``+foo=1``), which no block would read. ``hydra.*`` overrides pass untouched.
    """
    kept: list[str] = []
    problems: list[Problem] = []
    for override, parsed, problem in _parsed(overrides):
        if problem is not None:
            problems.append(problem)
            continue
        assert parsed is not None
        key = parsed.key_or_group
        root = key.replace("/", ".").split(".", 1)[0]
        if root == "hydra" or parsed.is_delete():
            kept.append(override)
        elif key in _GROUPS and not parsed.is_sweep_override() and not _is_option_name(parsed.value()):
            problems.append(
                Problem(
                    key,
                    f"a {key} option is one name, got {override.split('=', 1)[1]}",
                    f"{key}=<one of its options>; see `blocks list {key}`"
                    + (" (to sweep over options: -m with a,b)" if isinstance(parsed.value(), list) else ""),
                    check="unknown-option",
                )
            )
        elif root not in _GROUPS and (parsed.is_add() or parsed.is_force_add()):
            problems.append(_root_key_problem(key))
        else:
            kept.append(override)
    return kept, problems


def without_sweeps(overrides: Sequence[str]) -> list[str]:
    """*overrides* without those Hydra's grammar reads as sweeps (``a,b``, ``interval(0,1)``, ``choice(...)``).

    What Hydra composes for a sweep as a whole (its launcher, sweeper, callbacks), before any
    job: a dict or list value is kept, whatever commas it holds.
    """
    return [o for o, parsed, _ in _parsed(overrides) if parsed is None or not parsed.is_sweep_override()]


def _is_option_name(value: object) -> bool:
    return value is None or isinstance(value, str)


def _searchpath_problem(entry: str) -> Problem | None:
    """``pkg://module``: Hydra imports the module to read its configs, so it passes the import seam's rules."""
    from blocks.spec.imports import module_problem

    if not entry.startswith(PKG_SCHEME):
        return None
    module = entry[len(PKG_SCHEME) :].replace("/", ".").rstrip(".")
    return module_problem(module, SEARCHPATH_KEY, f"{entry} imports it to read its configs")


def keep_shipped_searchpath(overrides: Sequence[str]) -> list[str]:
    """*overrides* with ``hydra.searchpath=[...]`` extended by the shipped conf dir.

    Setting ``hydra.searchpath`` replaces the list, which would hide the presets blocks ships
    (``debug=fast``); the user's entries come first so they can still override a preset. A
    ``pkg://`` entry names a module Hydra imports: one the import seam would refuse raises
    :class:`ConfigError` before anything composes.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out = []
    for override in overrides:
        if _key(override) != SEARCHPATH_KEY:
            out.append(override)
            continue
        try:
            value = parser.parse_overrides([override])[0].value()
        except HydraException:
            out.append(override)
            continue
        entries = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        problems = [p for p in map(_searchpath_problem, entries) if p is not None]
        if problems:
            raise ConfigError(problems)
        entries += [s for s in paths.shipped_searchpath() if s not in entries]
        prefix = override.split("=", 1)[0]
        out.append(f"{prefix}=[{','.join(repr(entry) for entry in entries)}]")
    return out
