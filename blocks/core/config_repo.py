"""An isolated config store: a catalog's options, written into Hydra's ConfigStore only when composing.

Like hydra-zen's ``ZenStore``: options are collected in a value of their own, an option
stored twice from two different places is an error naming both, and Hydra's process-wide
``ConfigStore`` sees them only through :meth:`ConfigRepo.installed` (for the length of one
composition) or :meth:`ConfigRepo.install` (once, at the command-line edge). A node may be a
builder, called the first time Hydra loads the option, so that listing options imports nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from blocks.spec.errors import DuplicateName, Problem

PROVIDER = "blocks"
"""The ConfigStore provider of every option a :class:`ConfigRepo` writes (``blocks:<source>``)."""


@dataclass(frozen=True)
class StoredOption:
    """One option: where it goes, what builds its node, and where it comes from (for clash messages)."""

    group: str | None
    name: str
    package: str | None
    build: Callable[[], Any]
    source: str
    built: dict[str, Any] | None = field(default=None, compare=False)
    """Where the built node is kept; one dict shared between stores builds the node once for all."""

    @property
    def path(self) -> str:
        """``group/name`` (or ``name`` for a primary config)."""
        return f"{self.group}/{self.name}" if self.group else self.name


class ConfigRepo:
    """A catalog's config options, kept apart from Hydra's global ConfigStore."""

    def __init__(self) -> None:
        self._options: dict[str, StoredOption] = {}

    def add(
        self,
        group: str | None,
        name: str,
        node: Any,
        *,
        source: str,
        package: str | None = None,
        built: dict[str, Any] | None = None,
    ) -> None:
        """Store *node* (or a zero-argument builder of it) as option *name* of *group*.

        A namespaced name (``acme/resnet``) nests as Hydra looks it up (``model/acme/resnet``),
        keeping the group's package. Storing a path again from another *source* raises,
        naming both; from the same source it replaces the option. *built* keeps the built
        node for the next store that is given the same dict (for builders without side effects).
        """
        prefix, _, leaf = name.rpartition("/")
        sub = f"{group}/{prefix}" if group and prefix else group
        package = package or (group if prefix else None)
        build = node if callable(node) and not isinstance(node, type) else (lambda: node)
        option = StoredOption(sub, leaf, package, build, source, built)
        existing = self._options.get(option.path)
        if existing is not None and existing.source != source:
            raise clash(option.path, existing.source, source)
        self._options[option.path] = option

    def has(self, group: str, name: str) -> bool:
        """Whether option *name* of *group* is stored."""
        return f"{group}/{name}" in self._options

    def source(self, group: str, name: str) -> str | None:
        """Where option *name* of *group* comes from, or None."""
        option = self._options.get(f"{group}/{name}")
        return option.source if option else None

    def options(self) -> list[StoredOption]:
        """Every stored option, by path."""
        return [self._options[p] for p in sorted(self._options)]

    def merged_into(self, repo: dict[str, Any], *, only_hydras: bool = False) -> dict[str, Any]:
        """A copy of Hydra's ConfigStore *repo* with these options added (lazily built nodes).

        With *only_hydras* the copy keeps none of the options another catalog wrote (it starts
        from Hydra's own and other libraries'). An option the store holds already from
        elsewhere, or from a different source, is a clash.
        """
        from blocks.compat.hydra_private import lazy_config_node

        out = _copy_tree(repo, drop_own=only_hydras)
        for option in self.options():
            cur = out
            for part in (option.group or "").split("/") if option.group else ():
                cur = cur.setdefault(part, {})
                if not isinstance(cur, dict):
                    raise clash(option.path, "a config of that name in Hydra's ConfigStore", option.source)
            key = f"{option.name}.yaml"
            provider = f"{PROVIDER}:{option.source}"
            existing = cur.get(key)
            if existing is not None and getattr(existing, "provider", None) != provider:
                raise clash(option.path, _provider_source(existing), option.source)
            if existing is None:
                cur[key] = lazy_config_node(
                    option.name, option.group, option.package, provider, option.build, option.built
                )
        return out

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Hydra's ConfigStore holds these options inside the block, and what it held before after it."""
        from blocks.compat.hydra_private import config_store_repo, swap_config_store_repo

        previous = swap_config_store_repo(self.merged_into(config_store_repo(), only_hydras=True))
        try:
            yield
        finally:
            swap_config_store_repo(previous)

    def install(self) -> None:
        """Write these options into Hydra's global ConfigStore for good (the command-line edge, once)."""
        from blocks.compat.hydra_private import config_store_repo, swap_config_store_repo

        swap_config_store_repo(self.merged_into(config_store_repo()))


def _copy_tree(repo: dict[str, Any], *, drop_own: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in repo.items():
        if isinstance(value, dict):
            out[key] = _copy_tree(value, drop_own=drop_own)
        elif not (drop_own and str(getattr(value, "provider", "")).startswith(f"{PROVIDER}:")):
            out[key] = value
    return out


def _provider_source(node: Any) -> str:
    provider = str(getattr(node, "provider", None) or "unknown")
    return provider.removeprefix(f"{PROVIDER}:")


def clash(path: str, first: str, second: str) -> DuplicateName:
    """Option *path* stored from two places: an error naming both."""
    return DuplicateName(
        Problem(
            path.split("/", 1)[0],
            f"config option {path} is stored twice, differently: by {first} and by {second}",
            "rename one of them; an option is never overwritten",
            check="name-clash",
        )
    )
