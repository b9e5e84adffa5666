"""Values that come from the environment (``${oc.env:VAR}``) stay out of the files a run writes.

A token passed as ``monitor.logger_args.api_key='${oc.env:WANDB_API_KEY}'`` must not end up in
``config.yaml`` or ``plan.json``, which are shared with the run dir. Configs are resolved with
:func:`resolve_keeping_env`: every other interpolation is frozen, but a value that reads the
environment keeps its interpolation, and each process (driver and workers, which inherit the
environment) resolves it again when it builds the blocks. A plan keeps the same interpolations
(:attr:`blocks.core.plan.Plan.from_environment`) and shows them in place of the resolved values.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, read_write
from omegaconf.errors import OmegaConfBaseException

from blocks.compat.hydra_private import resolver_calls

ENV_RESOLVER = "oc.env"

KeyPath = tuple[str | int, ...]


def env_interpolations(cfg: DictConfig | ListConfig) -> dict[KeyPath, str]:
    """Every value of *cfg* (unresolved) that reads the environment, by path, as its interpolation text.

    Directly (``${oc.env:VAR}``) or through other keys (``${monitor.logger_args.csv.token}``,
    ``'Bearer ${...}'``, ``${oc.decode:${...}}`` where that key reads the environment): either
    way the resolved value holds the secret.
    """
    raw = OmegaConf.to_container(cfg, resolve=False)
    interpolations = {
        path: value for path, value in _leaves(raw, ()) if isinstance(value, str) and "${" in value
    }
    direct = {path: value for path, value in interpolations.items() if environment_reads(value)}
    if not direct or len(direct) == len(interpolations):
        return direct
    marked = [_with_markers(raw, list(direct), prefix) for prefix in _MARKERS]
    return {
        path: value for path, value in interpolations.items() if path in direct or _passes_on(marked, path)
    }


def environment_reads(value: str) -> list[str]:
    """The ``oc.env`` calls in the text of a config value, each as written (``${ oc.env :VAR,default}``).

    Read with OmegaConf's own grammar, so that spacing, nesting and escapes count exactly as they
    do when OmegaConf resolves the value. Text that does not parse counts as one read: it cannot
    be resolved anyway, and keeping it as text loses nothing.
    """
    if ENV_RESOLVER not in value:
        return []
    calls = resolver_calls(value, ENV_RESOLVER)
    return [value] if calls is None else calls


_MARKERS = ("blocksenvvalue", "blocksenvironmentvalue")
"""What stands for each environment value (a plain word, which any resolver takes as a string, and
of two lengths) while looking for the interpolations that pass one on."""
_UNRESOLVED = object()


def _passes_on(marked: list[DictConfig | ListConfig], path: KeyPath) -> bool:
    """Whether the interpolation at *path* carries an environment value, judged on two marked copies.

    It does when its value holds the marker, when it does not resolve with markers in place of
    the environment values (a resolver that wants more than a word), or when it changes with
    the markers and not by itself (a resolver that transforms the value).
    """
    first, second = (_resolved_at(copy_, path) for copy_ in marked)
    if first is _UNRESOLVED or second is _UNRESOLVED or _holds(first, _MARKERS[0]):
        return True
    return first != second and _resolved_at(marked[0], path) == first


def _leaves(value: Any, path: KeyPath) -> Iterator[tuple[KeyPath, Any]]:
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _leaves(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _leaves(child, (*path, index))
    else:
        yield path, value


def _with_markers(raw: Any, paths: list[KeyPath], prefix: str) -> DictConfig | ListConfig:
    """An untyped config of *raw* with a marker (*prefix* and a number) in place of the values at *paths*."""
    marked = copy.deepcopy(raw)
    for number, path in enumerate(paths):
        parent = marked
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = f"{prefix}{number}"
    return OmegaConf.create(marked)


def _resolved_at(cfg: DictConfig | ListConfig, path: KeyPath) -> Any:
    """The value at *path* resolved, or :data:`_UNRESOLVED` (the caller's own resolution says why)."""
    try:
        node: Any = cfg
        for key in path:
            node = node[key]
        return (
            OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node
        )
    except OmegaConfBaseException:
        return _UNRESOLVED


def _holds(value: Any, marker: str) -> bool:
    return any(isinstance(leaf, str) and marker in leaf for _, leaf in _leaves(value, ()))


def resolve_keeping_env(cfg: DictConfig, *, in_place: bool = False) -> DictConfig:
    """A resolved copy of *cfg* in which values read from the environment keep their ``${oc.env:...}``.

    The copy keeps *cfg*'s node types: a block's node stays typed by its dataclass, so turning
    it back into the block (:func:`blocks.core.compose.node_to_block`) needs no second
    validation. *in_place* resolves *cfg* itself, for a config the caller has just copied.
    Every interpolation is first resolved into a plain container, which raises OmegaConf's
    error naming the key for a value that cannot be resolved (an unset variable, a missing
    key, an interpolation of a ``???`` value); ``OmegaConf.resolve`` names no key, and turns an
    interpolated ``???`` into ``???`` silently. A resolved value that does not fit its typed
    node (``"[8,8]"`` from the environment for a list) leaves the result untyped, so that
    building the block names the key and the fix.
    """
    kept = env_interpolations(cfg)
    plain = OmegaConf.to_container(cfg, resolve=True)
    resolved = cfg if in_place else copy.deepcopy(cfg)
    try:
        with read_write(resolved):
            OmegaConf.resolve(resolved)
    except OmegaConfBaseException:
        untyped = OmegaConf.create(plain)
        assert isinstance(untyped, DictConfig)
        resolved = untyped
    with read_write(resolved):
        for path, raw in kept.items():
            parent: Any = resolved
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = raw
    return resolved
