"""An Optuna sweep's settings checked against the job (direction, storage), and the trials the precheck plans."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig

from blocks.spec.errors import ConfigError, Problem

OPTUNA = "hydra_optuna_sweeper"

_DIRECTION = {"min": "minimize", "max": "maximize"}


def sweeper_problems(cfg: DictConfig) -> list[Problem]:
    """Problems of a composed config (with its ``hydra`` node) whose Optuna sweeper would mis-rank or not start.

    The direction must be the one ``monitor.objective_mode`` says (a failed trial returns the
    worst value for that mode, so the opposite direction would pick it as the best), and a
    stored study needs an SQLAlchemy the installed Optuna can use. A single run
    (``hydra.mode=RUN``) starts no sweeper: its settings are not checked.
    """
    hydra = cfg.get("hydra") if isinstance(cfg, DictConfig) else None
    sweeper = hydra.get("sweeper") if isinstance(hydra, DictConfig) else None
    mode = hydra.get("mode") if isinstance(hydra, DictConfig) else None
    if getattr(mode, "name", mode) == "RUN":
        return []
    if not isinstance(sweeper, DictConfig) or OPTUNA not in str(sweeper.get("_target_", "")):
        return []
    return [*_direction_problems(cfg, sweeper), *_storage_problems(sweeper)]


def _direction_problems(cfg: DictConfig, sweeper: DictConfig) -> list[Problem]:
    raw = sweeper.get("direction")
    listed = list(raw) if isinstance(raw, (ListConfig, list, tuple)) else [raw]
    directions = [str(getattr(d, "name", d)) for d in listed]
    monitor = cfg.get("monitor")
    mode = str(monitor.get("objective_mode", "min")) if isinstance(monitor, DictConfig) else "min"
    objective = str(monitor.get("objective", "")) if isinstance(monitor, DictConfig) else ""
    wanted = _DIRECTION.get(mode, "minimize")
    if len(directions) > 1:
        return [
            Problem(
                "hydra.sweeper.direction",
                f"is {directions}, a multi-objective search, but each blocks job returns one value "
                f"(monitor.objective={objective})",
                f"hydra.sweeper.direction={wanted} (one direction, as monitor.objective_mode={mode} says)",
                check="sweeper-direction",
                related=("monitor.objective_mode",),
            )
        ]
    if directions == [wanted]:
        return []
    worst = "-inf" if mode == "max" else "inf"
    other = "min" if mode == "max" else "max"
    return [
        Problem(
            "hydra.sweeper.direction",
            f"is {directions[0]}, but monitor.objective_mode={mode}: Optuna would rank the trials "
            f"backwards, and a failed trial (which returns {worst}) would be the best",
            f"hydra.sweeper.direction={wanted} (or monitor.objective_mode={other} "
            f"hydra.sweeper.direction={_DIRECTION[other]})",
            check="sweeper-direction",
            related=("monitor.objective_mode",),
        )
    ]


def _storage_problems(sweeper: DictConfig) -> list[Problem]:
    """Optuna 2.x keeps a study in an SQL database through SQLAlchemy 1.x; with 2.x it fails on any database."""
    storage = sweeper.get("storage")
    if not storage or str(storage).startswith("redis"):
        return []
    optuna, sqlalchemy = _version("optuna"), _version("sqlalchemy")
    if optuna is None or sqlalchemy is None or int(optuna.split(".")[0]) >= 3:
        return []
    if int(sqlalchemy.split(".")[0]) < 2:
        return []
    return [
        Problem(
            "hydra.sweeper.storage",
            f"is a database URL, but Optuna {optuna} (the version hydra-optuna-sweeper installs) cannot "
            f"keep a study in a database with SQLAlchemy {sqlalchemy} (installed here, e.g. by "
            "blocks[monitor] for mlflow): it fails on any database, new or not",
            "hydra.sweeper.storage=null (the study lives in memory for this sweep; the trials' run "
            "dirs and optimization_results.yaml stay), or run the sweep from an environment with "
            "SQLAlchemy<2 (without blocks[monitor])",
            check="optuna-storage",
        )
    ]


def _version(distribution: str) -> str | None:
    import importlib.metadata  # only for a sweep that keeps its study in a database: not on every plan

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def searched_trials(
    overrides: Sequence[str], params: Mapping[Any, Any], values: Callable[[Any], list[str]] | None = None
) -> list[list[str]]:
    """*overrides* as the trials of a search that try every choice: each searched key at values of its space.

    A search dimension (``choice(a,b)``, ``range(...)``, ``interval(lo,hi)``, also under
    ``tag(...)``) on the command line or in ``hydra.sweeper.params`` (*params*) takes each of
    its choices in one trial (trial *i* takes choice *i*, a shorter dimension starts over), a
    range its two ends, an interval a point inside it; planning these trials catches an
    unknown key, an option a group does not have or a value of the wrong type before the
    search starts (Optuna would meet a bad choice only in the trial that samples it). A
    command-line key replaces the same key of *params*, as the sweeper does. Raises
    ``ConfigError`` for a search over a ``hydra.*`` key. *values* replaces how a dimension's
    values are chosen (see :func:`apart_trials`).
    """
    values_of = _values if values is None else values
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    dimensions: list[list[str]] = []
    seen, problems = set(), []
    for override in overrides:
        try:
            (parsed,) = parser.parse_overrides([override])
        except HydraException:
            dimensions.append([override])  # the plan reports it
            continue
        seen.add(parsed.key_or_group)
        if parsed.is_sweep_override() and parsed.key_or_group.startswith(("hydra.", "hydra/")):
            problems.append(_hydra_sweep_problem(parsed.key_or_group, override.split("=", 1)[1]))
        dimensions.append((values_of(parsed) or [override]) if parsed.is_sweep_override() else [override])
    for key, value in params.items():
        if str(key).lstrip("+~") in seen:
            continue
        try:
            (parsed,) = parser.parse_overrides([f"{key}={value}"])
        except HydraException:
            dimensions.append([f"{key}={value}"])
            continue
        dimensions.append(
            (values_of(parsed) or [f"{key}={value}"]) if parsed.is_sweep_override() else [f"{key}={value}"]
        )
    if problems:
        raise ConfigError(problems)
    count = max((len(values) for values in dimensions), default=1)
    return [[values[i % len(values)] for values in dimensions] for i in range(count)]


def apart_trials(overrides: Sequence[str], params: Mapping[Any, Any]) -> tuple[list[list[str]], list[str]]:
    """Two trials of a search that differ in every key it searches that can differ, and those keys.

    A ``choice`` or ``range`` takes its first value in one trial and its last in the other, an
    ``interval`` two points inside it; a search of one value takes it in both. What the two
    trials share (a ``checkpoint.dir`` that names no searched key) every trial of it shares.
    """
    trials = searched_trials(overrides, params, _two_values)
    keys = sorted({a.split("=", 1)[0].lstrip("+~") for a, b in zip(*trials, strict=False) if a != b})
    return trials, keys


def _two_values(override: Any) -> list[str]:
    """``key=value`` for two values of a sweep override as far apart as :func:`_values` allows (one when it has one)."""
    from hydra.core.override_parser.types import IntervalSweep

    value = override.value()
    if isinstance(value, IntervalSweep):
        assert value.start is not None and value.end is not None  # the grammar requires both
        start, end = float(value.start), float(value.end)
        log = "log" in (value.tags or ()) and start > 0 and end > 0
        if log:
            points = [start ** (2 / 3) * end ** (1 / 3), start ** (1 / 3) * end ** (2 / 3)]
        else:
            points = [start + (end - start) / 3, start + 2 * (end - start) / 3]
        key = override.get_key_element()
        return list(dict.fromkeys(f"{key}={point!r}" for point in points))
    values = _values(override)
    return list(dict.fromkeys([values[0], values[-1]])) if values else []


def _hydra_sweep_problem(key: str, value: str) -> Problem:
    """A search over a key of Hydra's own config, e.g. ``hydra.sweeper.params.optim.lr=interval(...)``."""
    searched = key.removeprefix("hydra.sweeper.params.")
    return Problem(
        key,
        f"{value} searches a key of Hydra's own config, which no sweeper can sweep",
        f"search the job's key itself: '{searched}={value}'"
        if searched != key
        else "drop it; search keys of the job (e.g. 'optim.lr=interval(1e-4,1e-1)')",
    )


def _values(override: Any) -> list[str]:
    """``key=value`` for the values of a sweep override a search must plan.

    Every choice of a ``choice``; a ``range``'s first and last value (its values are of one
    kind, its ends the extremes); a point inside an ``interval``, not an end: a search over
    ``interval(0, 0.1)`` never tries 0, which a key that must be positive would refuse (the
    middle, or the geometric middle of a ``log`` interval).
    """
    from hydra.core.override_parser.types import IntervalSweep, RangeSweep, Transformer

    key = override.get_key_element()
    value = override.value()
    if isinstance(value, IntervalSweep):
        assert value.start is not None and value.end is not None  # the grammar requires both
        start, end = float(value.start), float(value.end)
        log = "log" in (value.tags or ()) and start > 0 and end > 0
        middle = math.sqrt(start * end) if log else (start + end) / 2
        return [f"{key}={middle!r}"]
    values = override.sweep_iterator(transformer=Transformer.str)
    if isinstance(value, RangeSweep):
        first = next(values, None)
        values = [] if first is None else [first, *deque(values, maxlen=1)]
    return [f"{key}={one}" for one in dict.fromkeys(values)]
