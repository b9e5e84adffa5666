"""The ``hydra`` node of a composed config goes through the import seam before Hydra runs it.

Hydra instantiates ``hydra.callbacks``, ``hydra.launcher`` and ``hydra.sweeper`` (every
``_target_`` in them) and hands ``hydra.job_logging``/``hydra.hydra_logging`` to
``logging.config.dictConfig``, which imports ``class`` and calls ``()`` factories. An override
(``+hydra.callbacks.x._target_=...``) or a preset loaded with ``--config-dir`` or
``hydra.searchpath`` could name any of them; :func:`hydra_problems` checks each one with
:func:`blocks.spec.imports.resolve` (imported and checked, never called), so ``blocks run``
refuses them before Hydra starts and before any run dir exists.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import Container, DictConfig, ListConfig, OmegaConf

from blocks.compat.hydra_private import config_child
from blocks.spec.errors import ConfigError, Problem
from blocks.spec.imports import (
    ANY_CLASS,
    TARGET_KEY,
    Kind,
    interpolated_path_problem,
    resolve,
    subclass_of,
    targets_in,
)

HYDRA_PLUGINS = ("hydra._internal.core_plugins", "hydra_plugins")
"""Where Hydra's own launchers and sweepers and its installed plugins live."""

LAUNCHER = Kind("a Hydra Launcher class", subclass_of("hydra.plugins.launcher.Launcher"), HYDRA_PLUGINS)
SWEEPER = Kind("a Hydra Sweeper class", subclass_of("hydra.plugins.sweeper.Sweeper"), HYDRA_PLUGINS)
SWEEPER_PART = Kind("a class", also_allowed=("optuna.samplers", "optuna.pruners"))
"""Objects a sweeper builds from its settings (the Optuna sampler)."""
CALLBACK = Kind("a Hydra Callback class", subclass_of("hydra.experimental.callback.Callback"))
LOGGING_CLASS = Kind("a logging handler, formatter or filter class", also_allowed=("logging",))
LOGGING_NODES = ("job_logging", "hydra_logging")
LOGGING_FACTORY = "()"
LOGGING_STREAMS = ("ext://sys.stdout", "ext://sys.stderr")


def _kind_of(key: str) -> Kind:
    if key == f"hydra.launcher.{TARGET_KEY}":
        return LAUNCHER
    if key == f"hydra.sweeper.{TARGET_KEY}":
        return SWEEPER
    if key.startswith("hydra.sweeper."):
        return SWEEPER_PART
    parts = key.split(".")
    if len(parts) == 4 and parts[1] == "callbacks":
        return CALLBACK
    return ANY_CLASS


NODE_RESOLVERS = ("oc.decode", "oc.create")
"""OmegaConf's resolvers that turn a string into config nodes (which may hold a ``_target_``)."""

UNSAFE_ENV_PREFIXES = ("BLOCKS_", "PYTHON", "LD_", "DYLD_", "HYDRA_")
UNSAFE_ENV_NAMES = ("PATH", "BASH_ENV", "ENV")
"""Variables ``hydra.job.env_set`` may not set: blocks' own settings (the import allow-list),
Hydra's instantiation policy, and what makes a process load code (Python's and the loader's)."""


def hydra_problems(hydra: DictConfig) -> list[Problem]:
    """Every import path in the ``hydra`` node that may not be used, and every setting that would run code.

    Read unresolved, as Hydra will resolve it later: an import path must be written out (not
    an interpolation), and a value built by ``oc.decode``/``oc.create`` is resolved here and
    checked as the nodes it becomes.
    """
    plain = OmegaConf.to_container(hydra, resolve=False)
    assert isinstance(plain, dict)
    problems = _path_problems(plain, "hydra")
    for parent, built in _built_nodes(hydra, "hydra"):
        problems += [built] if isinstance(built, Problem) else _path_problems(built, parent)
    problems += _job_problems(plain.get("job"))
    problems += _launcher_problems(plain.get("launcher"))
    return problems


def _path_problems(hydra: Mapping[Any, Any], key: str) -> list[Problem]:
    """The import paths in *hydra* (a plain mapping at *key*) that may not be used."""
    problems = []
    for here, path in targets_in(hydra, key):
        interpolated = interpolated_path_problem(path, here)
        if interpolated is not None:
            problems.append(interpolated)
            continue
        try:
            resolve(path, here, kind=_kind_of(here))
        except ConfigError as exc:
            problems += exc.problems
    for node in LOGGING_NODES:
        problems += _logging_problems(hydra.get(node), f"{key}.{node}")
    return problems


def _built_nodes(node: Container, key: str) -> Iterator[tuple[str, Any]]:
    """``(parent key, {name: nodes})`` for each value under *node* that ``oc.decode``/``oc.create`` turns into nodes.

    Each such value is resolved here, in the environment Hydra will resolve it in; a value that
    cannot be resolved now yields a :class:`Problem` (what it would build cannot be checked).
    """
    items = enumerate(node) if isinstance(node, ListConfig) else ((k, None) for k in node)
    for name, _ in items:
        here = f"{key}[{name}]" if isinstance(node, ListConfig) else f"{key}.{name}"
        child = config_child(node, name)
        if child is None or child._is_none() or child._is_missing():
            continue
        if isinstance(child, Container) and not child._is_interpolation():
            yield from _built_nodes(child, here)
            continue
        raw = child._value()
        if not (isinstance(raw, str) and any(resolver in raw for resolver in NODE_RESOLVERS)):
            continue
        try:
            value = node[name]
        except Exception as exc:  # any resolution failure leaves the value unchecked
            yield (
                here,
                Problem(
                    here,
                    f"'{raw}' builds config nodes when Hydra resolves it, and cannot be resolved to be checked ({exc})",
                    f"write the value itself at {here}",
                    check="import-path",
                ),
            )
            continue
        if isinstance(value, Container):
            value = OmegaConf.to_container(value, resolve=False)
        if isinstance(value, (Mapping, list)):
            yield key, {name: value}


def _job_problems(job: Any) -> list[Problem]:
    """``hydra.job``: no environment variable that changes what a process trusts or loads; no chdir."""
    if not isinstance(job, Mapping):
        return []
    problems = []
    env_set = job.get("env_set")
    for name in env_set if isinstance(env_set, Mapping) else ():
        if str(name).startswith(UNSAFE_ENV_PREFIXES) or name in UNSAFE_ENV_NAMES:
            problems.append(
                Problem(
                    f"hydra.job.env_set.{name}",
                    f"a config may not set {name}: it changes what blocks trusts or what the "
                    "job's processes load and run",
                    f"set {name} in your own environment before `blocks run`, not in the config",
                    check="import-denied",
                )
            )
    if job.get("chdir") is True:
        problems.append(
            Problem(
                "hydra.job.chdir",
                "jobs run in the directory blocks was started in; changing into the run dir would "
                "read the project settings and recipe files found above it instead of yours",
                "drop hydra.job.chdir (the run dir is hydra.run.dir; paths in the config are "
                "relative to where you start blocks)",
                check="import-denied",
            )
        )
    return problems


def _launcher_problems(launcher: Any) -> list[Problem]:
    """``hydra.launcher.setup`` (submitit): shell commands written into the job script."""
    setup = launcher.get("setup") if isinstance(launcher, Mapping) else None
    if not setup:
        return []
    return [
        Problem(
            "hydra.launcher.setup",
            "the launcher would run these lines as shell commands in each job script; a config "
            "may not run commands",
            "run them before `blocks run` (jobs inherit the environment you submit from), or in "
            "your shell profile, and drop hydra.launcher.setup",
            check="import-denied",
        )
    ]


def _logging_problems(value: Any, key: str) -> list[Problem]:
    """``logging.config.dictConfig`` imports ``class`` values, calls ``()`` factories and resolves ``ext://``."""
    problems: list[Problem] = []
    if isinstance(value, Mapping):
        for name, item in value.items():
            here = f"{key}.{name}"
            if name in ("class", LOGGING_FACTORY) and isinstance(item, str):
                interpolated = interpolated_path_problem(item, here)
                if interpolated is not None:
                    problems.append(interpolated)
                    continue
                try:
                    resolve(item, here, kind=LOGGING_CLASS)
                except ConfigError as exc:
                    problems += exc.problems
            elif isinstance(item, str) and item.startswith("ext://") and item not in LOGGING_STREAMS:
                problems.append(
                    Problem(
                        here,
                        f"'{item}' makes logging import an object; only {', '.join(LOGGING_STREAMS)} may be named",
                        f"{here}=ext://sys.stdout",
                        check="import-denied",
                    )
                )
            else:
                problems += _logging_problems(item, here)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problems += _logging_problems(item, f"{key}[{index}]")
    return problems
