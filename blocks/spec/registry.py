"""The registry: every block by kind and name, as an import path, and where it came from.

A registry holds names, not classes: a built-in block is listed by ``module:Class``
(:data:`blocks.spec.manifest.BUILTIN_BLOCKS`) and its module is imported only when the block
is chosen (:attr:`Entry.cls`). ``@register`` adds to the active registry: the process default
:data:`REGISTRY`, or the one a :meth:`Registry.collecting` block names.
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from blocks.spec.block import KINDS, Block
from blocks.spec.errors import DuplicateName, Problem, RegistryError, describe_exception, did_you_mean
from blocks.spec.imports import PROJECT_MODULE
from blocks.spec.manifest import BUILTIN_BLOCKS

B = TypeVar("B", bound=type[Block])

PROJECT_PACKAGE = "project"
"""The ``package`` of a block the user's project registers (``blocks list --json``)."""


@dataclass(frozen=True)
class Entry:
    """A registered block, by import path, and its provenance.

    Attributes:
        kind: the block's kind (config group).
        name: the option name (``transformer``, ``acme/resnet``).
        target: ``module:Class``; the class is imported from it on first use of :attr:`cls`.
        package: the distribution that provides it (``blocks`` for built-ins).
        version: that distribution's version.
    """

    kind: str
    name: str
    target: str
    package: str
    version: str
    registered: type[Block] | None = field(default=None, compare=False, repr=False)
    """The class itself when ``@register`` ran (a class defined in a function has no import path)."""

    @property
    def cls(self) -> type[Block]:
        """The block class; imports its module the first time a lazily listed block is used."""
        if self.registered is not None:
            return self.registered
        module, _, qualname = self.target.partition(":")
        found: object = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        if not (isinstance(found, type) and issubclass(found, Block)):
            raise RegistryError(
                f"{self.kind} block '{self.name}' names {self.target}, which is not a block class"
            )
        return found


@dataclass(frozen=True)
class Rejected:
    """A package's block left out at registration: one of its fields is of a type no config can hold.

    Attributes:
        kind: the block's kind.
        name: the option name it would have had (``acme/withset``).
        target: ``module:Class``.
        package: the distribution that provides it.
        version: that distribution's version.
        field: the field no config can hold.
        type: that field's annotation, as written.
        reason: why OmegaConf refuses it.
    """

    kind: str
    name: str
    target: str
    package: str
    version: str
    field: str
    type: str
    reason: str


CONFIG_TYPES = (
    "bool, int, float, str, bytes, an enum, a pathlib.Path, a dataclass, Any, "
    "or a list, tuple[X, ...], dict[str, X] or Optional of these"
)
"""The field types a config holds, for messages (OmegaConf decides; see :func:`unconfigurable`)."""


def unconfigurable(cls: type[Block]) -> tuple[str, str, str] | None:
    """``(field, annotation, reason)`` when OmegaConf cannot make a structured config of *cls*, else None.

    The decision is OmegaConf's own (:func:`omegaconf.OmegaConf.structured` on the class, its
    defaults included), so a block is refused here exactly when its config node could not be built.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        OmegaConf.structured(cls)
    except OmegaConfBaseException as exc:
        key = str(getattr(exc, "full_key", "") or "")
        top = key.replace("[", ".").split(".")[0]
        annotations = {f.name: f.type for f in dataclasses.fields(cls)}
        annotation = annotations.get(top, "")
        shown = annotation if isinstance(annotation, str) else _type_name(annotation)
        return top, shown, describe_exception(exc)
    return None


def _type_name(annotation: object) -> str:
    """``frozenset``, ``tuple[int, str]``, ``Literal['a', 'b']``: an annotation as it is written."""
    if isinstance(annotation, type) and not hasattr(annotation, "__origin__"):
        return annotation.__name__
    return repr(annotation).replace("typing.", "")


def target_of(cls: type) -> str:
    """``module:QualName`` of a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


class Registry:
    """Block classes by kind and name.

    Built-in blocks register under their plain name; blocks of an installed package register
    under ``<entry point name>/<name>`` (see :mod:`blocks.core.packages`).
    """

    def __init__(
        self, kinds: Sequence[str] = KINDS, listed: Mapping[str, Mapping[str, str]] | None = None
    ) -> None:
        self.kinds = tuple(kinds)
        """The kinds (config groups) this registry holds: the kind table's names unless given."""
        self._entries: dict[str, dict[str, Entry]] = {kind: {} for kind in self.kinds}
        for kind, names in (listed or {}).items():
            for name, target in names.items():
                self._entries[kind][name] = Entry(kind, name, target, "blocks", "")
        self._namespace: str = ""
        self._package: tuple[str, str] = ("blocks", "")
        self.owner: Callable[[str], tuple[str, str, str] | None] = lambda module: None
        """Maps a class's module to ``(namespace, package, version)`` when a block package owns it.

        Set by package discovery, so a package's blocks get its namespace even when another
        package imports them first; otherwise the ``namespace`` context decides.
        """
        self.package_modules: list[str] = []
        """The module of every loaded block package, set by package discovery; configs may import from them."""
        self.rejected: list[Rejected] = []
        """A package's blocks left out because a field is of a type no config holds (package discovery reports them)."""

    @classmethod
    def builtin(cls) -> Registry:
        """A registry listing blocks' own blocks by import path (none is imported yet)."""
        return cls(listed=BUILTIN_BLOCKS)

    @contextmanager
    def collecting(self) -> Iterator[Registry]:
        """Make ``@register`` add to this registry inside the block (a catalog's own blocks)."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    @contextmanager
    def namespace(self, prefix: str, package: str, version: str) -> Iterator[None]:
        """Register everything inside the block under ``prefix/`` for *package*."""
        saved = self._namespace, self._package
        self._namespace, self._package = prefix, (package, version)
        try:
            yield
        finally:
            self._namespace, self._package = saved

    def add(self, cls: type[Block], name: str) -> Entry:
        """Register *cls* under its kind and *name* (namespaced when inside ``namespace``)."""
        kind = cls.kind
        if kind not in self._entries:
            raise RegistryError(
                f"{cls.__qualname__} has kind '{kind}', which is not a block kind; "
                f"subclass one of the kind bases ({', '.join(self.kinds)})"
            )
        if "__dataclass_fields__" not in cls.__dict__:
            raise RegistryError(
                f"{cls.__qualname__} is not a dataclass itself (only its bases are), so its own fields "
                f"would be dropped; decorate it with @dataclass(frozen=True, kw_only=True)"
            )
        if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            raise RegistryError(f"{cls.__qualname__} must be a frozen dataclass to be a block")
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RegistryError(
                    f"{cls.__qualname__}.{f.name} has no default; every block field needs one "
                    f"(use omegaconf.MISSING for a value the user must give)"
                )
        owner = self.owner(cls.__module__)
        namespace, (package, version) = (owner[0], owner[1:]) if owner else (self._namespace, self._package)
        target = target_of(cls)
        if BUILTIN_BLOCKS.get(kind, {}).get(name) == target:
            # a built-in imported for the first time by a package's import keeps its plain name
            namespace, (package, version) = "", ("blocks", "")
        elif not namespace and cls.__module__.startswith(PROJECT_MODULE + "."):
            package, version = PROJECT_PACKAGE, ""
        if not namespace and "/" in name:
            self._refuse_namespaced(cls, name)
        full = f"{namespace}/{name}" if namespace else name
        # blocks' own are known to hold (tests/test_registry.py): `blocks plan` does not pay for them
        bad = None if cls.__module__.startswith("blocks.") else unconfigurable(cls)
        if bad is not None:
            field_name, annotation, reason = bad
            if namespace:  # a package's: left out and reported, its other blocks still load
                self.rejected.append(Rejected(kind, full, target, package, version, *bad))
                cls.block_name = full
                return Entry(kind, full, target, package, version, cls)
            raise RegistryError(
                Problem(
                    f"{kind}.{field_name}",
                    f"{kind} block '{full}' ({cls.__module__}.{cls.__qualname__} in {_file(cls)}) has field "
                    f"'{field_name}' of type {annotation}, which no config can hold ({reason}); "
                    f"a block field must be one of: {CONFIG_TYPES}",
                    f"give {field_name} one of those types",
                    check="block-import",
                )
            )
        existing = self._entries[kind].get(full)
        if existing is not None and (
            existing.registered is not cls if existing.registered is not None else existing.target != target
        ):
            raise DuplicateName(
                Problem(
                    kind,
                    f"{kind} block '{full}' is registered twice: by {existing.package} "
                    f"({existing.cls.__module__}.{existing.cls.__qualname__} in {_file(existing.cls)}) "
                    f"and by {package} ({cls.__module__}.{cls.__qualname__} in {_file(cls)})",
                    "rename one of them (@register(NAME))",
                    check="name-clash",
                )
            )
        entry = Entry(kind, full, target, package, version, cls)
        self._entries[kind][full] = entry
        cls.block_name = full
        return entry

    def _refuse_namespaced(self, cls: type[Block], name: str) -> None:
        """A name with ``/`` registered outside a block package: that prefix is a package's namespace."""
        prefix = name.partition("/")[0]
        owners = {
            e.package
            for entries in self._entries.values()
            for e in entries.values()
            if e.name.startswith(prefix + "/")
        }
        whose = f", the namespace of the installed package {', '.join(sorted(owners))}," if owners else ""
        raise RegistryError(
            Problem(
                cls.kind,
                f"{cls.kind} block '{name}' ({cls.__module__}.{cls.__qualname__} in {_file(cls)}) is registered "
                f"under '{prefix}/'{whose} but outside a block package; only an installed block package's "
                f"blocks have names with '/' (its entry-point name, then the block's); register it under a "
                f'plain name, e.g. @register("{name.replace("/", "_")}")',
                f'@register("{name.replace("/", "_")}")',
                check="name-clash",
            )
        )

    def add_entry(self, entry: Entry) -> None:
        """Add an entry another registry holds already (a package's blocks, registered once per process)."""
        self._entries[entry.kind].setdefault(entry.name, entry)

    def drop_namespace(self, prefix: str) -> None:
        """Forget every block registered under ``prefix/`` (a package that failed half-way)."""
        for entries in self._entries.values():
            for name in [n for n in entries if n.startswith(prefix + "/")]:
                del entries[name]

    def get(self, kind: str, name: str) -> Entry:
        """The entry for *kind*/*name*, or a :class:`RegistryError` with a did-you-mean."""
        if kind not in self._entries:
            hint = did_you_mean(kind, self.kinds)
            raise RegistryError(f"'{kind}' is not a block kind" + (f"; {hint}" if hint else ""))
        try:
            return self._entries[kind][name]
        except KeyError:
            names = sorted(self._entries[kind])
            hint = did_you_mean(name, names)
            raise RegistryError(
                f"no {kind} block named '{name}'"
                + (f"; {hint}" if hint else "")
                + f" (available: {', '.join(names)})"
            ) from None

    def names(self, kind: str) -> list[str]:
        """Registered names of one kind, sorted."""
        return sorted(self._entries[kind])

    def entries(self, kind: str | None = None) -> list[Entry]:
        """All entries, or those of one kind, in kind order then name order."""
        kinds = [kind] if kind else list(self.kinds)
        return [self._entries[k][n] for k in kinds for n in sorted(self._entries[k])]


def _file(cls: type) -> str:
    try:
        return inspect.getsourcefile(cls) or cls.__module__
    except TypeError:
        return cls.__module__


REGISTRY = Registry.builtin()
"""The default registry: blocks' own blocks by import path, plus what ``@register`` adds outside a catalog."""

_ACTIVE: contextvars.ContextVar[Registry] = contextvars.ContextVar("blocks_registry", default=REGISTRY)


def active_registry() -> Registry:
    """The registry ``@register`` adds to here: a :meth:`Registry.collecting` one, else :data:`REGISTRY`."""
    return _ACTIVE.get()


def register(name: str) -> Callable[[B], B]:
    """Class decorator: register a block class under *name* in its kind.

    Example::

        @register("mlp")
        @dataclass(frozen=True, kw_only=True)
        class MLP(ModelBlock):
            hidden: tuple[int, ...] = (128,)
    """

    def decorate(cls: B) -> B:
        _ACTIVE.get().add(cls, name)
        return cls

    return decorate
