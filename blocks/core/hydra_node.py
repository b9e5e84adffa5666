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

from collections.abc import Mapping
from typing import Any

from blocks.spec.errors import ConfigError, Problem
from blocks.spec.imports import ANY_CLASS, TARGET_KEY, Kind, resolve, subclass_of, targets_in

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


def hydra_problems(hydra: Mapping[Any, Any]) -> list[Problem]:
    """Every import path in the ``hydra`` node (unresolved, as a plain mapping) that may not be used."""
    problems = []
    for key, path in targets_in(hydra, "hydra"):
        try:
            resolve(path, key, kind=_kind_of(key))
        except ConfigError as exc:
            problems += exc.problems
    for node in LOGGING_NODES:
        problems += _logging_problems(hydra.get(node), f"hydra.{node}")
    return problems


def _logging_problems(value: Any, key: str) -> list[Problem]:
    """``logging.config.dictConfig`` imports ``class`` values, calls ``()`` factories and resolves ``ext://``."""
    problems: list[Problem] = []
    if isinstance(value, Mapping):
        for name, item in value.items():
            here = f"{key}.{name}"
            if name in ("class", LOGGING_FACTORY) and isinstance(item, str):
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
