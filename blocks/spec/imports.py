"""Safe imports by path: the one seam through which a config may name Python code.

Configs create registered blocks only. Every import path a config names (an adapter's
``model.target``, a ``_target_`` inside its arguments, a ``monitor.loggers`` class, a
``_target_`` in the ``hydra`` node: callbacks, launcher, sweeper) goes through :func:`resolve`
(at build time) and :func:`path_problem` (at plan time). The rule is default-deny: a path is
honoured only inside blocks' own modules, the modules installed block packages declare, the
few library modules a field names itself (Lightning's loggers for ``monitor.loggers``,
Hydra's plugins for ``hydra.launcher``), and the prefixes the user allows in their *own*
settings, never in the config itself:

* the environment variable ``BLOCKS_ALLOW_IMPORTS`` (comma-separated prefixes), and/or
* ``[tool.blocks] allow_imports = ["mylab"]`` in the ``pyproject.toml`` of the project the
  command runs in (the nearest one above the working directory).

Whatever is allowed, paths into modules that run commands, evaluate code or touch the process
(``os``, ``subprocess``, ``builtins``, ``importlib``, ``pickle``, ...) are always refused. The
check runs twice: on the string before anything is imported (torch-free, at plan time), and on
the object the path resolves to (its real ``__module__`` and ``__qualname__``), so an alias
such as ``mylab.run = os.system`` is refused too; and the object must be of the :class:`Kind` the
field expects (an ``nn.Module`` class, a Lightning logger class, a Hydra ``Callback`` class, at
least a class) before anything calls it, so a function that wraps ``subprocess`` in an allowed
package is refused as well.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blocks.spec.errors import ConfigError, Problem

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext

ENV_VAR = "BLOCKS_ALLOW_IMPORTS"
TARGET_KEY = "_target_"
PROJECT_MODULE = "blocks_project"
"""The package a project's recipe files are imported as (see :mod:`blocks.core.project`)."""

DENIED_MODULES = (
    "builtins",
    "os",
    "posix",
    "nt",
    "subprocess",
    "_posixsubprocess",
    "shutil",
    "sys",
    "importlib",
    "runpy",
    "pty",
    "socket",
    "pickle",
    "_pickle",
    "marshal",
    "ctypes",
    "multiprocessing",
    "asyncio",
    "code",
    "codeop",
    "webbrowser",
    "signal",
    "io",
    "_io",
    "pathlib",
    "tempfile",
    "shelve",
    "pdb",
    "dill",
    "cloudpickle",
    "torch.hub",
    "torch.serialization",
    "torch.utils.cpp_extension",
    "torch.utils.collect_env",
    "torch.load",
    "torch.save",
    "torch.jit",
    "torch.package",
    "torch.distributed.run",
    "torch.distributed.elastic",
    "torch.multiprocessing",
    "numpy.load",
    "hydra.utils",
    "hydra.main",
    "hydra._internal.utils",
    "hydra._internal.instantiate",
    "omegaconf",
    "blocks.spec.imports",
    "blocks.spec.imports",
    "functools",
    "operator",
    "inspect",
    "types",
    "gc",
    "atexit",
    "threading",
    "_thread",
    "concurrent",
    "timeit",
    "trace",
    "profile",
    "cProfile",
    "pydoc",
    "doctest",
    "unittest",
    "pkgutil",
    "zipimport",
    "site",
    "sysconfig",
    "platform",
    "distutils",
    "setuptools",
    "pip",
    "urllib",
    "http",
    "ftplib",
    "smtplib",
    "imaplib",
    "xmlrpc",
    "yaml",
    "jsonpickle",
    "joblib",
    "copyreg",
    "sqlite3",
    "dbm",
    "glob",
    "fileinput",
    "zipfile",
    "tarfile",
    "logging.config",
)
"""Modules never reachable from a config, even when a user's prefix covers them."""

DENIED_NAMES = frozenset(
    {"eval", "exec", "compile", "__import__", "system", "popen", "open", "getattr", "setattr", "breakpoint"}
)
"""Callable names refused in any module (``numpy.lib.utils.eval``-style re-exports)."""

_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")

OWN_PREFIXES = ("blocks",)
"""blocks' own modules: always importable (their classes are what configs are made of)."""


@dataclass(frozen=True)
class Kind:
    """What a config field expects an import path to name, checked on the imported object before any call.

    Attributes:
        what: how the refusal names it ("a torch.nn.Module class").
        accepts: whether an imported object is of this kind (only called on classes).
        also_allowed: module prefixes this field may always name (a library's own plugins).
        refuses: ``(why, fix)`` when a class of this kind still cannot be used as the field would
            use it (a LightningModule whose own steps would be ignored), else None.
    """

    what: str
    accepts: Callable[[type], bool] = lambda cls: True
    also_allowed: tuple[str, ...] = ()
    refuses: Callable[[type], tuple[str, str] | None] = lambda cls: None

    def admits(self, obj: Any) -> bool:
        """True when *obj* is a class of this kind (functions never are: they could wrap anything)."""
        return inspect.isclass(obj) and self.accepts(obj)


def subclass_of(*bases: str) -> Callable[[type], bool]:
    """A :attr:`Kind.accepts` test: a subclass of any of the classes at the import paths *bases*.

    The bases are imported when an object is checked (never at plan time); an uninstalled one is skipped.
    """

    def accepts(cls: type) -> bool:
        for base in bases:
            module, _, name = base.rpartition(".")
            try:
                base_cls = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                continue
            if issubclass(cls, base_cls):
                return True
        return False

    return accepts


ANY_CLASS = Kind("a class")
"""The least a config may name: a class (a function could wrap ``subprocess``; a class is built with its arguments)."""


def allowed_prefixes(cwd: Path | None = None) -> tuple[str, ...]:
    """The module prefixes the user allows: ``BLOCKS_ALLOW_IMPORTS`` plus the project's pyproject."""
    return user_list(ENV_VAR, "allow_imports", "module prefixes", '["mylab"]', cwd)


def user_list(env_var: str, key: str, what: str, example: str, cwd: Path | None = None) -> tuple[str, ...]:
    """A list from the user's own settings, never from a config.

    *env_var* (comma-separated) plus ``[tool.blocks] <key>`` of the project's pyproject (the
    nearest above *cwd*, default the working directory).
    """
    values = [v.strip() for v in os.environ.get(env_var, "").split(",") if v.strip()]
    pyproject = nearest_pyproject(cwd or Path.cwd())
    if pyproject is not None:
        values += pyproject_list(pyproject, key, what, example)
    return tuple(dict.fromkeys(values))


def implicit_prefixes() -> tuple[str, ...]:
    """Always importable: blocks' own modules, every loaded block package's module, the project's recipe files.

    The project's recipe files (``blocks_project.*``, see :mod:`blocks.core.project`) are
    admitted only once this process has loaded them: they are the user's own code, which
    ``blocks`` ran already when it found them.
    """
    from blocks.spec.registry import REGISTRY

    own = (PROJECT_MODULE,) if PROJECT_MODULE in sys.modules else ()
    return (*OWN_PREFIXES, *REGISTRY.package_modules, *own)


def nearest_pyproject(start: Path) -> Path | None:
    """The ``pyproject.toml`` in *start* or its nearest parent that has one."""
    for directory in (start.resolve(), *start.resolve().parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _pyproject_prefixes(path: Path) -> tuple[str, ...]:
    return pyproject_list(path, "allow_imports", "module prefixes", '["mylab"]')


def pyproject_list(path: Path, key: str, what: str, example: str) -> tuple[str, ...]:
    """``[tool.blocks] <key>`` of the pyproject at *path*: a list of strings (*what*, e.g. *example*), or none."""
    try:
        text = path.read_text(encoding="utf-8")  # TOML is UTF-8, whatever the locale
    except (OSError, UnicodeDecodeError) as exc:
        raise _unreadable(str(path), key, exc) from None
    return _tool_blocks_list(text, str(path), key, what, example)


def _unreadable(path: str, key: str, exc: Exception) -> ConfigError:
    return ConfigError(Problem(f"tool.blocks.{key}", f"{path} could not be read: {exc}", f"correct {path}"))


@functools.lru_cache(maxsize=8)
def _tool_blocks_list(text: str, path: str, key: str, what: str, example: str) -> tuple[str, ...]:
    """``[tool.blocks] <key>`` of a pyproject's *text*: parsed once per content, not once per use."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except ValueError as exc:
        raise _unreadable(path, key, exc) from None
    value = data.get("tool", {}).get("blocks", {}).get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            Problem(
                f"tool.blocks.{key}",
                f"{path}: [tool.blocks] {key} must be a list of {what}, got {value!r}",
                f"{key} = {example}",
            )
        )
    return tuple(value)


def _under(path: str, prefixes: Sequence[str]) -> str | None:
    """The first prefix *path* is inside (``a.b`` is inside ``a`` and ``a.b``, not ``ab``)."""
    for prefix in prefixes:
        if path == prefix or path.startswith(prefix + "."):
            return prefix
    return None


def _allow_fix(path: str) -> str:
    top = path.split(".")[0]
    return (
        f"if you trust {top}, allow it in your own settings (not in the config): "
        f'export {ENV_VAR}={top}, or [tool.blocks] allow_imports = ["{top}"] in your pyproject.toml'
    )


def _refusal(
    path: str, allowed: Sequence[str], kind: Kind = ANY_CLASS, *, module: bool = False
) -> tuple[str, str, str] | None:
    """``(check, why, fix)`` when *path* may not be imported, else None (string checks only).

    With *module*, *path* names a module to import (not a class or function in one): only the
    module rules apply, denied modules and allowed prefixes.
    """
    if not module and (not isinstance(path, str) or not _PATH.match(path) or "__" in path):
        return "import-path", "is not an import path of a class or function", "package.module.ClassName"
    denied = _under(path, DENIED_MODULES)
    name = path.rsplit(".", 1)[-1]
    if denied is not None or (not module and name in DENIED_NAMES):
        reached = f"module {denied}" if denied else f"a function named '{name}'"
        return (
            "import-denied",
            f"is refused: configs may never reach {reached} (it can run commands or code)",
            "name the kind of class this key expects; a config can never reach modules that run commands, code or pickles",
        )
    if _under(path, (*implicit_prefixes(), *kind.also_allowed, *allowed)) is None:
        return (
            "import-not-allowed",
            f"is not in a module prefix you allow for imports (allowed: {', '.join(allowed) or 'none'})",
            _allow_fix(path),
        )
    return None


def module_problem(module: str, key: str, why: str) -> Problem | None:
    """What is wrong with letting a config import *module* (read at config key *key*; *why* it would be imported).

    The import paths' rules for modules: blocks', installed block packages' and the project's
    modules, and the prefixes the user allows, never a denied module. None when allowed.
    """
    if not re.match(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", module) or "__" in module:
        return Problem(
            key, f"'{module}' is not a module name ({why})", f"{key}: name a package", check="import-path"
        )
    refusal = _refusal(module, allowed_prefixes(), module=True)
    if refusal is None:
        return None
    check, reason, fix = refusal
    return Problem(key, f"'{module}' {reason}: {why}", fix, check=check)


INTERPOLATION = "${"
"""What starts an OmegaConf interpolation inside a string value."""


def interpolated_path_problem(value: Any, key: str) -> Problem | None:
    """A problem when the import path at *key* is an interpolation rather than written out.

    An interpolation is resolved again where the path is used (``${oc.env:...}`` in each worker,
    from an environment the config may change), so the path checked would not be the one imported.
    """
    if not (isinstance(value, str) and INTERPOLATION in value):
        return None
    return Problem(
        key,
        f"an import path must be written out, not interpolated ({value}): it is resolved again "
        "where it is used, after the check",
        f"{key}=package.module.ClassName",
        check="import-path",
    )


def path_problem(
    path: str, key: str, allowed: Sequence[str] | None = None, *, kind: Kind = ANY_CLASS
) -> Problem | None:
    """What is wrong with import path *path* (read at config key *key*), checking the string only.

    Torch-free and imports nothing: the plan runs it. None when the path may be imported.
    """
    refusal = _refusal(path, allowed_prefixes() if allowed is None else allowed, kind)
    if refusal is None:
        return None
    check, why, fix = refusal
    if check == "import-path":
        fix = f"{key}={fix}"
    return Problem(key, f"'{path}' {why}", fix, check=check)


def targets_in(value: Any, key: str) -> list[tuple[str, str]]:
    """Every ``_target_`` in a nested argument structure, as ``(key, path)``."""
    found = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k == TARGET_KEY:
                found.append((f"{key}.{TARGET_KEY}", v))
            else:
                found += targets_in(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found += targets_in(v, f"{key}[{i}]")
    return found


def resolve(path: str, key: str, allowed: Sequence[str] | None = None, *, kind: Kind = ANY_CLASS) -> Any:
    """Import the object at *path* after checking the string, then check what it really is.

    Raises :class:`ConfigError` naming *key* when the path is refused, cannot be imported,
    resolves (through an alias) to something outside the allowed prefixes or in a refused
    module, or is not of the *kind* the field expects. Nothing is called before all passed.
    """
    allowed = allowed_prefixes() if allowed is None else allowed
    problem = path_problem(path, key, allowed, kind=kind)
    if problem is not None:
        raise ConfigError(problem)
    obj = _import(path, key)
    real = _real_name(obj)
    if real is None:
        raise ConfigError(
            Problem(
                key,
                f"'{path}' is a {type(obj).__name__}, not a class or function",
                "name a class (or a function that returns the object)",
                check="import-path",
            )
        )
    if real != path:
        refusal = _refusal(real, allowed, kind)
        if refusal is not None:
            check, why, fix = refusal
            raise ConfigError(Problem(key, f"'{path}' is really {real}, which {why}", fix, check=check))
    if not kind.admits(obj):
        raise ConfigError(
            Problem(
                key,
                f"'{path}' is {_describe(obj)}, not {kind.what}",
                f"name {kind.what} here",
                check="import-kind",
            )
        )
    unusable = kind.refuses(obj)
    if unusable is not None:
        raise ConfigError(Problem(key, f"'{path}' {unusable[0]}", unusable[1], check="import-kind"))
    return obj


def _describe(obj: Any) -> str:
    if inspect.isclass(obj):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    return f"a {type(obj).__name__}"


def _import(path: str, key: str) -> Any:
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue
            raise ConfigError(
                Problem(key, f"importing '{module_name}' failed: {exc}", "install what it needs")
            ) from None
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise ConfigError(
                Problem(key, f"module '{module_name}' has no attribute '{'.'.join(parts[split:])}'", "")
            ) from None
        return obj
    raise ConfigError(
        Problem(key, f"no module of '{path}' can be imported", "check the spelling and install")
    )


def _real_name(obj: Any) -> str | None:
    """``module.qualname`` of a class or function (of the function behind a bound method)."""
    owner = getattr(obj, "__self__", None)
    if inspect.ismethod(obj) or (
        inspect.isbuiltin(obj) and owner is not None and not inspect.ismodule(owner)
    ):
        owner_name = _real_name(owner if inspect.isclass(owner) else type(owner))
        return f"{owner_name}.{obj.__name__}" if owner_name else None
    if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
        return None
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname:
        return None
    return f"{module}.{qualname}"


def instantiate(value: Any, key: str, allowed: Sequence[str] | None = None) -> Any:
    """Build the objects a nested argument structure names with ``_target_`` (each checked to be a class)."""
    if isinstance(value, Mapping):
        args = {str(k): instantiate(v, f"{key}.{k}", allowed) for k, v in value.items() if k != TARGET_KEY}
        if TARGET_KEY not in value:
            return args
        return resolve(value[TARGET_KEY], f"{key}.{TARGET_KEY}", allowed)(**args)
    if isinstance(value, (list, tuple)):
        return [instantiate(v, f"{key}[{i}]", allowed) for i, v in enumerate(value)]
    return value


def refuse_objects(blocks: Iterable[Any]) -> None:
    """Import every path the *blocks* name (:meth:`Block.import_paths`) and check what each really is.

    Nothing is called. ``blocks run`` does this before it starts anything, so an alias such as
    ``mylab.run = os.system`` or an allowed function that wraps ``subprocess`` is refused
    before a run dir exists; raises one :class:`ConfigError` with every refusal.
    """
    problems: list[Problem] = []
    for block in blocks:
        for key, path, kind in block.import_paths():
            try:
                resolve(path, key, kind=kind)
            except ConfigError as exc:
                problems += exc.problems
    if problems:
        raise ConfigError(problems)


def nested_paths(kwargs: Any, key: str) -> list[tuple[str, str, Kind]]:
    """Every nested ``_target_`` of constructor arguments *kwargs* (read at *key*): each must name a class."""
    return [(where, path, ANY_CLASS) for where, path in targets_in(kwargs, key)]


def check_import_paths(ctx: CheckContext, kind: str, target: str, kwargs: Any) -> None:
    """Report a missing, refused or not-allowed import path (the target and every nested ``_target_``)."""
    if target == "???":  # omegaconf.MISSING: the config left the target out
        ctx.error("target", "names no class", f"{kind}.target=mylab.module.ClassName", check="import-path")
        return
    report_import_paths(
        ctx,
        [
            (key, path, ANY_CLASS)
            for key, path in [(f"{kind}.target", target), *targets_in(kwargs, f"{kind}.kwargs")]
        ],
    )


def entry_import_paths(entry: Mapping[str, Any], key: str, kind: Kind) -> list[tuple[str, str, Kind]]:
    """The import paths of a ``{_target_: <class>, <argument>: ...}`` entry at config *key*.

    Its own class must be of *kind*; a nested ``_target_`` in its arguments may be any allowed class.
    """
    args = {k: v for k, v in entry.items() if k != TARGET_KEY}
    return [(f"{key}.{TARGET_KEY}", entry[TARGET_KEY], kind)] + [
        (where, path, ANY_CLASS) for where, path in targets_in(args, key)
    ]


def report_import_paths(ctx: CheckContext, paths: Iterable[tuple[str, str, Kind]]) -> None:
    """Report each ``(key, path, kind)`` whose path the string check refuses (torch-free, imports nothing)."""
    for key, path, kind in paths:
        problem = path_problem(path, key, kind=kind)
        if problem is not None:
            ctx.error(problem.key, problem.message, problem.fix, check=problem.check)
