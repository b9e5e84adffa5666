"""Shell completion through Hydra's own completion plugins (bash, zsh, fish).

``eval "$(blocks run -sc install=bash)"`` installs Hydra's completion function for the
``blocks`` command, as for any Hydra app; that function asks ``blocks -sc query=bash`` for
the candidates of the line typed so far (in ``COMP_LINE``). blocks answers the query itself:
the command name after ``blocks``, then for ``run`` and ``plan`` Hydra's own candidates from
blocks' composition (group names ``optim=``, options ``optim=sgd``, and the keys of the chosen
blocks ``optim.lr=``), with the project's recipes and presets among them.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
from collections.abc import Sequence

COMMANDS = ("run", "plan", "list", "eval", "export", "report", "data", "new-package")
"""The subcommands of ``blocks``, as completed after ``blocks``."""

_FLAGS = {"plan": ("--json", "--multirun", "--config-dir"), "list": ("--json",)}


def is_query(args: Sequence[str]) -> str | None:
    """The shell of ``-sc query=SHELL`` (``--shell-completion query=SHELL``) in *args*, else None."""
    for flag, value in itertools.pairwise(args):
        if flag in ("-sc", "--shell-completion") and value.startswith("query="):
            return value.split("=", 1)[1]
    return None


def candidates(line: str) -> list[str]:
    """The completions of the last word of *line* (``blocks run opt`` → ``optim=``, ...)."""
    words = line.split()
    new_word = line.endswith(" ") or not words
    rest = _without_recipes_option(words[1:])
    typed = [] if new_word else rest[-1:]
    before = rest if new_word else rest[:-1]
    word = typed[0] if typed else ""
    if not before:
        return [c for c in COMMANDS if c.startswith(word)]
    command, args = before[0], before[1:]
    if word.startswith("-"):
        return [f for f in _FLAGS.get(command, ()) if f.startswith(word)]
    if command == "list":
        from blocks.core.compose import GROUPS

        return [g for g in GROUPS if g.startswith(word)] if not args else []
    if command not in ("run", "plan"):
        return []
    overrides = [a for a in args if not a.startswith("-")]
    return _hydra_candidates([*overrides, word] if word else overrides, new_word=not word)


def _without_recipes_option(words: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--recipes":
            skip = True
        elif not word.startswith("--recipes="):
            out.append(word)
    return out


def _hydra_candidates(overrides: list[str], *, new_word: bool) -> list[str]:
    """Hydra's own completion of the last override, against blocks' primary config."""
    from hydra import initialize
    from hydra.core.global_hydra import GlobalHydra

    from blocks.compat.hydra_private import hydra_completion
    from blocks.core import catalog
    from blocks.core.compose import BLOCK_KEY, PRIMARY_CONFIG

    catalog.register_configs()  # every recipe's presets are options to complete
    GlobalHydra.instance().clear()
    with initialize(version_base="1.3", config_path=None, job_name="blocks"):
        loader = GlobalHydra.instance().hydra.config_loader  # type: ignore[union-attr]
        line = " ".join(overrides) + (" " if new_word else "")
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                found = hydra_completion(loader, PRIMARY_CONFIG, line)
            except Exception:  # a half-typed line must never print a traceback at <TAB>
                return []
        return [c for c in found if f".{BLOCK_KEY}=" not in c]


def answer_query(shell: str) -> int:
    """Print the candidates for ``COMP_LINE`` the way Hydra's *shell* function reads them."""
    try:
        found = candidates(os.environ.get("COMP_LINE", "blocks "))
    except Exception:  # completion stays silent on a broken project
        found = []
    print(("\n" if shell == "fish" else " ").join(found))
    return 0
