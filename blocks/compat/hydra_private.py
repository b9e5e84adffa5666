"""Hydra and OmegaConf internals behind one seam (torch-free); see :mod:`blocks.compat`."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from hydra.core.override_parser.types import Override
    from omegaconf import Container, DictConfig, Node


def hydra_args_parser() -> argparse.ArgumentParser:
    """The argument parser of a ``@hydra.main`` app (``hydra._internal.utils.get_args_parser``)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def run_hydra_app(argv: Sequence[str], task_function: Callable[[DictConfig], Any], config_name: str) -> None:
    """What ``@hydra.main(version_base="1.3", config_path=None, config_name=...)`` does, for *argv* instead of ``sys.argv``.

    ``hydra.main`` reads the process's ``sys.argv``; the CLI runs it for its own argument
    list (``blocks run ARGS``, or :func:`blocks.cli.main.run_captured`) without rewriting it.
    ``--experimental-rerun`` is not supported (``blocks run`` refuses it before this).
    """
    from hydra import version
    from hydra._internal.utils import _run_hydra, get_args_parser

    version.setbase("1.3")
    parser = get_args_parser()
    args = parser.parse_args(list(argv))
    _run_hydra(
        args=args, args_parser=parser, task_function=task_function, config_path=None, config_name=config_name
    )


def hydra_config_loader(extra_search_path: Sequence[tuple[str, str]] = ()) -> Any:
    """Hydra's config loader over its default search path plus *extra_search_path* ``(provider, url)`` entries.

    Hydra builds one inside ``compose``/``main`` only; listing a group's options or parsing
    sweep overrides outside a run needs its own (``hydra._internal.config_loader_impl``).
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    search_path = create_config_search_path(None)
    for provider, url in extra_search_path:
        search_path.append(provider, url)
    return ConfigLoaderImpl(config_search_path=search_path)


def split_sweep(overrides: list[Override]) -> list[list[list[str]]]:
    """The jobs Hydra's basic sweeper launches for parsed *overrides*, in one batch (``BasicSweeper.split_arguments``)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper.split_arguments(overrides, None)


def config_header(text: str) -> dict[str, str | None]:
    """The ``# @package`` header of a YAML config's text, as Hydra reads it (``ConfigSource._get_header_dict``)."""
    from hydra.plugins.config_source import ConfigSource

    return ConfigSource._get_header_dict(text)


def config_child(node: Container, key: Any) -> Node | None:
    """The child node of *node* at *key* without resolving interpolations (OmegaConf's ``_get_node``)."""
    child = node._get_node(key)
    return child if not isinstance(child, list) else None


HYDRA_MESSAGES: dict[str, re.Pattern[str]] = {
    "converted": re.compile(r"converted to (\w+)"),
    "missing_group": re.compile(r"You must specify '([\w/]+)'"),
    "override": re.compile(r"override '([^=']*)"),
    "raised_while_composing": re.compile(r"In '([\w./-]+)': \w+ raised while composing config"),
    "full_key": re.compile(r"full_key: ([\w./]+)"),
    "could_not_override": re.compile(r"Could not override '([\w./]+)'"),
    "sweep_without_multirun": re.compile(
        r"Ambiguous value for argument|Sweep parameters .* requires --multirun"
    ),
}
"""Hydra and OmegaConf report mistakes only as English text; these read the key or value out of it."""


def hydra_message(name: str, message: str, *, anchored: bool = False) -> re.Match[str] | None:
    """The match of :data:`HYDRA_MESSAGES` pattern *name* in an error *message* (at its start when *anchored*)."""
    pattern = HYDRA_MESSAGES[name]
    return pattern.match(message) if anchored else pattern.search(message)


def hydra_completion(config_loader: Any, config_name: str, line: str) -> list[str]:
    """Hydra's own completion candidates for the last word of *line* (``BashCompletion._query``)."""
    from hydra._internal.core_plugins.bash_completion import BashCompletion

    found: list[str] = BashCompletion(config_loader)._query(config_name=config_name, line=line)
    return found


def share_config_store() -> None:
    """Make a deep copy of Hydra's ``ConfigStore`` the store itself, so a compose stops copying every option.

    Each ``hydra.compose`` builds a ``CachingConfigRepository`` that deep-copies its delegate
    repository (``hydra._internal.config_repository``) to keep its list of sources apart; that
    repository's structured source holds the process-wide ``ConfigStore``, so every compose
    copied every registered block, recipe and preset (most of a ``blocks plan``). Sharing it is
    safe: ``ConfigStore.load`` already returns a deep copy of the node it reads, and a source
    made anew takes ``ConfigStore.instance()`` anyway.
    """
    from hydra.core.config_store import ConfigStore

    def shared(self: ConfigStore, memo: dict[int, Any]) -> ConfigStore:
        return self

    ConfigStore.__deepcopy__ = shared  # type: ignore[attr-defined]
