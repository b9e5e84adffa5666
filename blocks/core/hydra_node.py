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

import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import Container, DictConfig, ListConfig, OmegaConf, read_write

from blocks.compat.hydra_private import config_child, is_whole_interpolation, unresolved
from blocks.core.env_set import env_set_problems
from blocks.core.launcher_options import launcher_problems
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
LOGGING_ATTRIBUTES = "."
LOGGING_STREAMS = ("ext://sys.stdout", "ext://sys.stderr")
_LOG_NAME = r"(?!\.)(?:[\w-]|\$\{hydra[.:]job\.name\}|\.(?!\.))*\.log"
JOB_LOG_FILE = re.compile(rf"\$\{{hydra[.:]runtime\.output_dir\}}/{_LOG_NAME}")
HYDRA_LOG_FILE = re.compile(_LOG_NAME)
"""Where a log file of Hydra's logging may be: a ``.log`` file in the run dir; for Hydra's own ``hydra_logging``,
configured before the run dir exists, a ``.log`` file where blocks starts (as ``hydra_debug`` does)."""
REMOTE_HANDLERS = frozenset(
    f"logging.handlers.{name}"
    for name in (
        "SocketHandler",
        "DatagramHandler",
        "SysLogHandler",
        "HTTPHandler",
        "SMTPHandler",
        "NTEventLogHandler",
    )
)
"""Logging handlers that send every record to another host or process."""

PER_JOB = re.compile(r"\$\{hydra[.:]job\.(?:num|id)\}")
"""What Hydra's launcher sets for each job of a sweep, after the check: the job's number or id."""
PER_JOB_NAMES = ("job.name", "output_subdir", "sweep.subdir")
"""Settings judged as names: one may read :data:`PER_JOB`."""

SETTLED = (
    "job.env_set",
    "job.chdir",
    "job.name",
    "sweeper.custom_search_space",
    "output_subdir",
    "runtime.output_dir",
    "run.dir",
    "sweep.dir",
    "sweep.subdir",
)
"""Settings of the ``hydra`` node read as Hydra will resolve them."""


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

LOGGING_PATHS = tuple(f"hydra.{node}" for node in LOGGING_NODES)
RUNS_CODE = ("hydra.callbacks", "hydra.launcher", "hydra.sweeper", *LOGGING_PATHS)
"""The parts of the ``hydra`` node that Hydra instantiates or hands to ``logging.config.dictConfig``."""

MAX_INDIRECTION = 16
"""How many interpolations deep a node built from interpolations is followed (a cycle ends the check)."""


def hydra_problems(hydra: DictConfig) -> list[Problem]:
    """Every import path in the ``hydra`` node that may not be used, and every setting that would run code.

    Read unresolved, as Hydra will resolve it later: an import path must be written out (not
    an interpolation), and a value that resolves to nodes (``${stash}``, ``oc.select``,
    ``oc.decode``, ``oc.create``) is resolved here and checked as the nodes it becomes.
    """
    plain = OmegaConf.to_container(hydra, resolve=False)
    assert isinstance(plain, dict)
    problems = _path_problems(plain, "hydra")
    for parent, built in _built_nodes(hydra, "hydra"):
        problems += [built] if isinstance(built, Problem) else _path_problems(built, parent)
    settled = {path: _settled(hydra, path, plain) for path in SETTLED}
    problems += [problem for _, problem in settled.values() if problem is not None]
    problems += _dir_problems(hydra, settled, plain)
    problems += _env_problems(settled["job.env_set"][0])
    problems += _chdir_problems(settled["job.chdir"][0])
    problems += _job_name_problems(settled["job.name"][0])
    problems += _search_space_problems(settled["sweeper.custom_search_space"][0])
    problems += _output_subdir_problems(settled["output_subdir"][0])
    # Hydra sets the run dir when the job runs; set before, it moves where Hydra's logging writes
    if settled["runtime.output_dir"][0] is not None:
        fix = "the run dir is hydra.run.dir (hydra.sweep.dir for a sweep)"
        problems.append(_set_by_hydra("hydra.runtime.output_dir", fix))
    problems += launcher_problems(hydra)
    return problems


def _path_problems(nodes: Mapping[Any, Any], key: str) -> list[Problem]:
    """The import paths in *nodes* (a plain mapping at *key*, ``hydra`` or inside it) that may not be used."""
    problems = []
    for here, path in targets_in(nodes, key):
        interpolated = interpolated_path_problem(path, here)
        if interpolated is not None:
            problems.append(interpolated)
            continue
        try:
            resolve(path, here, kind=_kind_of(here))
        except ConfigError as exc:
            problems += exc.problems
    if key == "hydra":
        for node in LOGGING_NODES:
            problems += _logging_problems(nodes.get(node), f"{key}.{node}")
    elif _within(key, LOGGING_PATHS):
        problems += _logging_problems(nodes, key)
    return problems


def _within(key: str, parts: tuple[str, ...]) -> bool:
    return any(key == part or key.startswith((f"{part}.", f"{part}[")) for part in parts)


def _built_nodes(node: Container, key: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """``(parent key, {name: nodes})`` for each value under *node* that resolves to nodes.

    Such a value (one interpolation and nothing else, or an ``oc.decode``/``oc.create`` call)
    is resolved here, in the environment Hydra will resolve it in, and followed into what it
    becomes. A value that cannot be resolved now yields a :class:`Problem` where Hydra would
    run what it builds (what it would build cannot be checked). Text around an interpolation
    makes a string: such values are left as they are (``hydra.overrides`` holds the command
    line's interpolations as text, ``hydra.run.dir`` reads ``${now:...}``).
    """
    names: Iterable[Any] = range(len(node)) if isinstance(node, ListConfig) else list(node)
    for name in names:
        here = f"{key}[{name}]" if isinstance(node, ListConfig) else f"{key}.{name}"
        child = config_child(node, name)
        if child is None:
            continue
        unset, interpolation, raw = unresolved(child)
        if unset:
            continue
        if isinstance(child, Container) and not interpolation:
            yield from _built_nodes(child, here, depth)
            continue
        if not (interpolation and isinstance(raw, str)):
            continue
        decoded = any(resolver in raw for resolver in NODE_RESOLVERS)
        logging_value = (
            _within(here, LOGGING_PATHS) and name != "filename"
        )  # a filename is judged by its text
        if not (decoded or logging_value or is_whole_interpolation(raw)):
            continue
        try:
            value = node[name]
        except Exception as exc:  # any resolution failure leaves the value unchecked
            if decoded or _within(here, RUNS_CODE):
                yield here, _unresolvable(here, f"'{raw}'", exc)
            continue
        if isinstance(value, str) and logging_value and _names_an_object(value):
            yield here, _ext_problem(value, here)  # logging resolves ext:// after Hydra resolved the text
        if not isinstance(value, (Container, Mapping, list)):
            continue
        if depth >= MAX_INDIRECTION:
            yield here, _unresolvable(here, f"'{raw}'", RecursionError("interpolations lead back to it"))
            continue
        plain = OmegaConf.to_container(value, resolve=False) if isinstance(value, Container) else value
        yield key, {name: plain}
        if isinstance(value, Container):  # what it became may hold interpolations of its own
            yield from _built_nodes(value, here, depth + 1)


def _unresolvable(key: str, what: str, exc: Exception) -> Problem:
    return Problem(
        key,
        f"{what} is resolved by Hydra later, and cannot be resolved now to be checked ({exc})",
        f"write the value itself at {key}",
        check="import-path",
    )


def _settled(hydra: DictConfig, path: str, plain: Mapping[Any, Any]) -> tuple[Any, Problem | None]:
    """The value at *path* of the ``hydra`` node as Hydra will see it, and a problem when that cannot be had now.

    An interpolation is resolved; a mapping's own values stay as they are (only its keys are
    checked). A name that reads only what Hydra's launcher sets per job (``${hydra.job.num}``)
    is judged with a number in its place (*plain* is the node unresolved).
    """
    try:
        value = OmegaConf.select(hydra, path, throw_on_missing=False)
    except Exception as exc:  # resolving may fail in any of OmegaConf's or a resolver's ways
        raw = _at(plain, path)
        if path in PER_JOB_NAMES and isinstance(raw, str) and PER_JOB.search(raw):
            judged = _with_a_job_number(hydra, path, raw)
            if judged is not None:
                return judged, None
        if path in DIRS:
            return None, _unresolvable_dir(f"hydra.{path}", raw, exc)
        return None, _unresolvable(f"hydra.{path}", "its value", exc)
    return value, None


def _with_a_job_number(hydra: DictConfig, path: str, raw: str) -> Any:
    """*raw* (the value at *path*) resolved with ``0`` for what Hydra's launcher sets per job; None if it still fails.

    The rest of it resolves as Hydra will (``${hydra.runtime.choices.optim}/${hydra.job.num}``).
    """
    stand_in = PER_JOB.sub("0", raw)
    if "${" not in stand_in:
        return stand_in
    try:
        with read_write(hydra):
            OmegaConf.update(hydra, path, stand_in)
            return OmegaConf.select(hydra, path, throw_on_missing=False)
    except Exception:  # resolving may fail in any of OmegaConf's or a resolver's ways
        return None
    finally:
        with read_write(hydra):
            OmegaConf.update(hydra, path, raw)


DIRS = {"run.dir": "RUN", "sweep.dir": "MULTIRUN", "sweep.subdir": "MULTIRUN"}
"""Where Hydra writes a run (and in which ``hydra.mode``): it creates these directories before the job starts."""
HYDRA_RESOLVER = re.compile(r"\$\{hydra:([^}]*)\}")
DIR_FIX = "{key}=<a directory> (or leave it out: {default})"
DIR_DEFAULTS = {
    "run.dir": "outputs/<recipe>/<date and time>",
    "sweep.dir": "multirun/<recipe>/<date and time>",
    "sweep.subdir": "the job's number",
}


def _unresolvable_dir(key: str, raw: Any, exc: Exception) -> Problem:
    """A run dir setting that cannot be resolved: Hydra would fail creating the run dir, after the check."""
    fix = DIR_FIX.format(key=key, default=DIR_DEFAULTS[key.removeprefix("hydra.")])
    env = re.search(r"\$\{oc\.env:([^,}]+)\}", str(raw))
    if env is not None:
        name = env.group(1).strip()
        fix = (
            f"set the environment variable {name}, or give a default: {key}='${{oc.env:{name},outputs/run}}'"
        )
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return Problem(key, f"'{raw}' cannot be resolved ({reason}); Hydra creates the run dir from it", fix)


def _dir_problems(
    hydra: DictConfig, settled: Mapping[str, tuple[Any, Problem | None]], plain: Mapping[Any, Any]
) -> list[Problem]:
    """``hydra.run.dir``, ``hydra.sweep.dir`` and ``hydra.sweep.subdir``: a directory Hydra can create.

    Empty is the current directory, where a run would replace your own files; a ``${hydra:...}``
    naming no setting becomes ``None``; a path at or under a file cannot be created. In a known
    ``hydra.mode`` only its own directory is checked (a single run never reads ``hydra.sweep.dir``).
    """
    mode = OmegaConf.select(hydra, "mode", default=None)
    mode_name = getattr(mode, "name", None if mode is None else str(mode))
    problems: list[Problem] = []
    for path, used_in in DIRS.items():
        value, unresolvable = settled[path]
        key = f"hydra.{path}"
        if unresolvable is not None or (mode_name is not None and mode_name != used_in):
            continue
        fix = DIR_FIX.format(key=key, default=DIR_DEFAULTS[path])
        raw = _at(plain, path)
        unknown = [name for name in HYDRA_RESOLVER.findall(str(raw)) if not _has(hydra, name.strip())]
        if unknown:
            problems.append(
                Problem(key, f"'{raw}' reads ${{hydra:{unknown[0]}}}, which is no setting of Hydra's", fix)
            )
        elif value is None or not str(value).strip():
            what = "null" if value is None else "empty"
            problems.append(
                Problem(
                    key, f"is {what}, which is no directory (a run would write into the current one)", fix
                )
            )
    if not problems:
        run_dir, sweep_dir, subdir = (settled[path][0] for path in DIRS)
        if run_dir is not None and mode_name != "MULTIRUN":
            problems += _uncreatable(str(run_dir), "hydra.run.dir")
        if sweep_dir is not None and mode_name != "RUN":
            problems += _uncreatable(str(sweep_dir), "hydra.sweep.dir")
            job_dir = Path(str(sweep_dir)) / str(subdir)
            if not problems and subdir is not None:
                problems += _uncreatable(str(job_dir), "hydra.sweep.subdir")
    return problems


def _has(hydra: DictConfig, name: str) -> bool:
    """Whether *name* is a setting of the ``hydra`` node (what ``${hydra:name}`` reads)."""
    missing = object()
    try:
        return OmegaConf.select(hydra, name, default=missing, throw_on_missing=False) is not missing
    except Exception:  # a key that does not parse names nothing
        return False


def _uncreatable(directory: str, key: str) -> list[Problem]:
    """A problem when *directory*, or a folder above it, is a file: Hydra could not create it.

    Whether a folder can be written is left to the run (``blocks run`` creates the run dir
    first and names the key): a plan may be made where the run will not be.
    """
    target = Path(directory).absolute()
    for at in (target, *target.parents):
        if not (at.exists() or at.is_symlink()):
            continue
        if at.is_dir():
            return []
        what = "it is a file" if at == target else f"'{at}' is a file"
        return [Problem(key, f"'{directory}' cannot be created: {what}", f"{key}=<a directory>")]
    return []


def _at(plain: Mapping[Any, Any], path: str) -> Any:
    """The value at dotted *path* of a plain mapping, or None."""
    node: Any = plain
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _env_problems(env_set: Any) -> list[Problem]:
    """``hydra.job.env_set``: only variables that tune a process, or that the user allows (:mod:`blocks.core.env_set`)."""
    names = env_set.keys() if isinstance(env_set, (Mapping, DictConfig)) else ()
    return env_set_problems(str(name) for name in names)


def _chdir_problems(chdir: Any) -> list[Problem]:
    """``hydra.job.chdir``: jobs run where blocks was started."""
    if chdir is not True:
        return []
    return [
        Problem(
            "hydra.job.chdir",
            "jobs run in the directory blocks was started in; changing into the run dir would "
            "read the project settings and recipe files found above it instead of yours",
            "drop hydra.job.chdir (the run dir is hydra.run.dir; paths in the config are "
            "relative to where you start blocks)",
            check="import-denied",
        )
    ]


def _job_name_problems(name: Any) -> list[Problem]:
    """``hydra.job.name`` names files in the run dir (``<name>.log``): a plain name only."""
    if not isinstance(name, str) or not re.search(r"[/\\]|^\.", name):
        return []
    return [
        Problem(
            "hydra.job.name",
            f"'{name}' is not a plain name; Hydra names the job's log file after it, in the run dir",
            "hydra.job.name=<letters, digits, '-', '_' or '.'> (or leave it out)",
            check="import-denied",
        )
    ]


def _output_subdir_problems(subdir: Any) -> list[Problem]:
    """``hydra.output_subdir`` is where Hydra writes its own copy of the config: a folder name in the run dir."""
    if subdir is None or (isinstance(subdir, str) and re.fullmatch(r"\.?[\w-]+(?:\.[\w-]+)*", subdir)):
        return []
    return [
        Problem(
            "hydra.output_subdir",
            f"'{subdir}' is not a folder name in the run dir; Hydra writes its copy of the config there",
            "hydra.output_subdir=.hydra (or null)",
            check="import-denied",
        )
    ]


def _set_by_hydra(key: str, fix: str) -> Problem:
    return Problem(
        key,
        "is set by Hydra when the job runs; a config that sets it moves what Hydra writes",
        fix,
        check="import-denied",
    )


def _search_space_problems(path: Any) -> list[Problem]:
    """The Optuna sweeper imports ``custom_search_space`` and calls it with every trial: a function named by a config."""
    if path is None:
        return []
    return [
        Problem(
            "hydra.sweeper.custom_search_space",
            f"'{path}' names a function the sweeper would import and call with every trial; "
            "configs never name functions (they could wrap anything)",
            "describe the search space in hydra.sweeper.params (e.g. "
            "hydra.sweeper.params.optim.lr='tag(log, interval(1e-4, 1e-2))') and drop custom_search_space",
            check="import-denied",
        )
    ]


def _log_file_problems(filename: Any, key: str) -> list[Problem]:
    """A log handler's ``filename`` must be a ``.log`` file in the run dir: logging would create, truncate or append to it."""
    if _within(key, ("hydra.hydra_logging",)):
        pattern, where, fix = HYDRA_LOG_FILE, "where blocks starts", "hydra-${hydra.job.name}.log"
    else:
        pattern, where, fix = (
            JOB_LOG_FILE,
            "in the run dir",
            "${hydra.runtime.output_dir}/${hydra.job.name}.log",
        )
    if isinstance(filename, str) and pattern.fullmatch(filename):
        return []
    return [
        Problem(
            key,
            f"'{filename}' is not a .log file {where}; logging would create, truncate or append to it",
            f"{key}='{fix}'",
            check="import-denied",
        )
    ]


def _names_an_object(value: str) -> bool:
    return value.startswith("ext://") and value not in LOGGING_STREAMS


def _ext_problem(value: str, key: str) -> Problem:
    return Problem(
        key,
        f"'{value}' makes logging import an object; only {', '.join(LOGGING_STREAMS)} may be named",
        f"{key}=ext://sys.stdout",
        check="import-denied",
    )


LOG_LEVEL_AT = re.compile(r"hydra\.(?:job|hydra)_logging\.(?:root|(?:loggers|handlers)\.[^.]+)\.level")
"""Where ``logging.config.dictConfig`` reads a level: the root logger, each logger, each handler."""


def _level_problems(level: Any, key: str) -> list[Problem]:
    """A logging level is one of logging's names (``INFO``) or a number; dictConfig raises on others when the job starts."""
    if isinstance(level, int) and not isinstance(level, bool):
        return []
    if isinstance(level, str) and ("${" in level or isinstance(logging.getLevelName(level), int)):
        return []
    names = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET")
    return [
        Problem(
            key,
            f"'{level}' is not a logging level; logging would refuse it when the job starts",
            f"{key}=<one of {', '.join(names)}> (e.g. {key}=INFO)",
        )
    ]


def _logging_problems(value: Any, key: str) -> list[Problem]:
    """``logging.config.dictConfig`` imports ``class`` values, calls ``()`` factories, resolves ``ext://`` and opens ``filename``."""
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
                    handler = resolve(item, here, kind=LOGGING_CLASS)
                except ConfigError as exc:
                    problems += exc.problems
                    continue
                if f"{handler.__module__}.{handler.__qualname__}" in REMOTE_HANDLERS:
                    problems.append(
                        Problem(
                            here,
                            f"'{item}' sends every log record to another host or process",
                            f"log to the console or a file in the run dir ({here}=logging.StreamHandler)",
                            check="import-denied",
                        )
                    )
            elif name == "filename":
                problems += _log_file_problems(item, here)
            elif name == "level" and LOG_LEVEL_AT.fullmatch(here):
                problems += _level_problems(item, here)
            elif name == LOGGING_ATTRIBUTES:
                problems.append(
                    Problem(
                        here,
                        "sets attributes of the logging object after it is made (a handler's file, for one)",
                        f"drop {here}; give the settings as the object's arguments",
                        check="import-denied",
                    )
                )
            elif isinstance(item, str) and _names_an_object(item):
                problems.append(_ext_problem(item, here))
            else:
                problems += _logging_problems(item, here)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problems += _logging_problems(item, f"{key}[{index}]")
    return problems
