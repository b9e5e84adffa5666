"""Block packages: installed distributions that contribute blocks, presets and recipes.

A distribution declares an entry point in the ``blocks`` group (DESIGN.md, "Block packages")::

    [project.entry-points."blocks"]
    acme = "acme_blocks"

Importing ``acme_blocks`` registers its blocks and recipes under ``acme/`` (``model=acme/resnet``);
YAML files in its ``conf/<group>/`` directory become options ``<group>=acme/<file stem>``. The
module says which version of the block API it targets with ``BLOCKS_API = 1``.

A package that fails to import, that claims a name another package claims, or that targets
another API version is recorded as a :class:`PackageProblem`: the others still load, the CLI
shows the problem, and a run that chooses one of its options is refused with the package named.
A block of a package with a field no config can hold is left out at registration and recorded
the same way, for that block alone: the package's other blocks are options as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import traceback
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from blocks.core.recipe import RECIPES
from blocks.spec.block import Block
from blocks.spec.errors import ConfigError, Problem, RegistryError, describe_exception
from blocks.spec.registry import CONFIG_TYPES, REGISTRY, Entry, Rejected

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

ENTRY_POINT_GROUP = "blocks"
API_VERSION = 1
"""The block API this version of ``blocks`` implements; a package sets ``BLOCKS_API`` to it."""

_NAMESPACE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class BlockPackage:
    """A loaded block package.

    Attributes:
        namespace: the entry-point name, the prefix of its options (``acme``).
        module: the module the entry point names.
        distribution: the installed distribution's name.
        version: the distribution's version.
        api: the ``BLOCKS_API`` the module declares (None when it declares none).
        conf: its ``conf/`` directory of YAML presets and recipes, if it has one.
    """

    namespace: str
    module: str
    distribution: str
    version: str
    api: int | None
    conf: Path | None

    @property
    def compatible(self) -> bool:
        """Whether the package targets the block API of this ``blocks``."""
        return self.api == API_VERSION

    @property
    def label(self) -> str:
        """``distribution version``."""
        return f"{self.distribution} {self.version}".strip()


@dataclass(frozen=True)
class PackageProblem:
    """A block package that could not be used.

    Attributes:
        namespace: the entry-point name the problem is about.
        reason: ``import`` (raised while importing), ``collision`` (two packages claim the
            name), ``incompatible`` (targets another block API), ``invalid`` (bad name) or
            ``field-type`` (one block has a field no config can hold; only it is left out).
        message: what is wrong, naming the package(s).
        fix: what the package's author or the user should do.
        option: for ``field-type``, the ``kind=name`` option that was left out.
    """

    namespace: str
    reason: Literal["import", "collision", "incompatible", "invalid", "field-type"]
    message: str
    fix: str
    option: str = ""

    def problem(self, severity: Literal["error", "warning"] = "warning") -> Problem:
        """As a :class:`Problem` keyed ``package:<namespace>``."""
        return Problem(
            f"package {self.namespace}", self.message, self.fix, severity, f"package-{self.reason}"
        )


_packages: dict[str, BlockPackage] = {}
_problems: dict[str, PackageProblem] = {}
_discovered = False


def packages() -> list[BlockPackage]:
    """Every loaded block package, by namespace."""
    return [_packages[n] for n in sorted(_packages)]


def package_problems() -> list[PackageProblem]:
    """Every block package that could not be (fully) used, by namespace; then each block left out."""
    return [_problems[n] for n in sorted(_problems)] + _left_out()


def _left_out() -> list[PackageProblem]:
    """The blocks of loaded packages that registration left out (a field no config can hold)."""
    return [_left_out_problem(r) for r in REGISTRY.rejected if r.name.partition("/")[0] in _packages]


def _left_out_problem(rejected: Rejected) -> PackageProblem:
    kind, name = rejected.kind, rejected.name
    label = f"{rejected.package} {rejected.version}".strip()
    return PackageProblem(
        name.partition("/")[0],
        "field-type",
        f"package {label}: {kind} block '{name}' ({rejected.target}) has field '{rejected.field}' of type "
        f"{rejected.type}, which no config can hold ({rejected.reason}); it is left out, the package's "
        f"other blocks can be used",
        f"report it to the maintainers of {rejected.package} (a block field must be one of: {CONFIG_TYPES}); "
        f"until then choose another {kind} block (`blocks list {kind}`)",
        f"{kind}={name}",
    )


def discover(group: str = ENTRY_POINT_GROUP) -> None:
    """Import every installed block package once, each inside its namespace; record the failures."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    if not _any_declares(group):
        return  # no installed distribution declares the group: importlib.metadata is not needed
    from importlib.metadata import entry_points

    by_name: dict[str, list[EntryPoint]] = defaultdict(list)
    for ep in entry_points(group=group):
        by_name[ep.name].append(ep)
    # A package's blocks take its namespace even when another package imports them first; those of
    # a package that is not loaded (its namespace collides, or is invalid) take none.
    owners: dict[str, tuple[str, str, str]] = {}
    refused: dict[str, tuple[str, str, str]] = {}
    for namespace, eps in by_name.items():
        if len({_dist_label(ep) for ep in eps}) == 1 and _NAMESPACE.match(namespace):
            owners[eps[0].module] = (namespace, *_dist_name_version(eps[0]))
        else:
            refused.update((ep.module, (namespace, *_dist_name_version(ep))) for ep in eps)

    by_top = _owners_by_top_level(owners)

    def owner(module: str) -> tuple[str, str, str] | None:
        found = _owner_of(module, owners) or by_top.get(module.split(".")[0])
        if found is None and (lost := _owner_of(module, refused)) is not None:
            namespace, dist_name, version = lost
            raise RegistryError(
                f"{module} is part of package {dist_name} {version}, whose block namespace '{namespace}' "
                "was not loaded (see `blocks list`): its blocks cannot be registered under another"
            )
        return found

    REGISTRY.owner = RECIPES.owner = owner
    for name in sorted(by_name):
        claims = {_dist_label(ep): ep for ep in by_name[name]}
        if len(claims) > 1:
            claimants = " and ".join(sorted(claims))
            _problems[name] = PackageProblem(
                name,
                "collision",
                f"packages {claimants} both claim the block namespace '{name}'; neither was loaded",
                "uninstall one of them, or ask one author to rename its entry point in "
                '[project.entry-points."blocks"]',
            )
            continue
        _load(name, next(iter(claims.values())))


def _owner_of(module: str, owners: dict[str, tuple[str, str, str]]) -> tuple[str, str, str] | None:
    """The owner of the entry-point module that *module* is, or is inside; the longest match wins.

    Two distributions may share a top-level namespace package (``acme.vision`` and
    ``acme.tabular``): a module belongs to the package whose entry point names it or a parent of it.
    """
    best = ""
    for top in owners:
        if (module == top or module.startswith(top + ".")) and len(top) > len(best):
            best = top
    return owners[best] if best else None


def _owners_by_top_level(owners: dict[str, tuple[str, str, str]]) -> dict[str, tuple[str, str, str]]:
    """The owner of each top-level package that one package's entry points alone live in.

    A package whose entry point is a submodule (``alpha_pkg.plugin``) owns its sibling modules
    (``alpha_pkg.models``) too, even when another package imports them first; a top-level
    package two packages share (a namespace package) is left to :func:`_owner_of`.
    """
    by_top: dict[str, tuple[str, str, str] | None] = {}
    for module, owner in owners.items():
        top = module.split(".")[0]
        by_top[top] = owner if by_top.get(top, owner) == owner else None
    return {top: owner for top, owner in by_top.items() if owner is not None}


def _any_declares(group: str) -> bool:
    """Whether any distribution on ``sys.path`` has ``[group]`` in its ``entry_points.txt``.

    A quick scan of the metadata directories, without importing and parsing every
    distribution's metadata as ``importlib.metadata`` does; when it finds the group, discovery
    asks ``importlib.metadata`` for the real entry points.
    """
    header = f"[{group}]"
    for entry in sys.path:
        try:
            listing = os.scandir(entry or ".")
        except OSError:
            continue
        with listing:
            for found in listing:
                if not found.name.endswith((".dist-info", ".egg-info")):
                    continue
                try:
                    with open(os.path.join(found.path, "entry_points.txt"), encoding="utf-8") as text:
                        if header in text.read():
                            return True
                except OSError:
                    continue
    return False


def _dist_label(ep: EntryPoint) -> str:
    dist = ep.dist
    if dist is None:
        return ep.value
    return f"{dist.metadata['Name']} {dist.version}"


def _dist_name_version(ep: EntryPoint) -> tuple[str, str]:
    if ep.dist is None:
        return ep.module, ""
    return ep.dist.metadata["Name"], ep.dist.version


def _load(name: str, ep: EntryPoint) -> None:
    dist_name, version = _dist_name_version(ep)
    label = f"{dist_name} {version}".strip()
    if not _NAMESPACE.match(name):
        _problems[name] = PackageProblem(
            name,
            "invalid",
            f"package {label} declares the block namespace '{name}', which is not a plain name",
            "name the entry point with letters, digits, '_' and '-' only, e.g. acme = \"acme_blocks\"",
        )
        return
    try:
        with REGISTRY.namespace(name, dist_name, version), RECIPES.namespace(name, dist_name):
            module = importlib.import_module(ep.module)
    except (Exception, SystemExit) as exc:  # a package that exits while importing must not end blocks
        REGISTRY.drop_namespace(name)
        RECIPES.drop_namespace(name)
        _problems[name] = PackageProblem(
            name,
            "import",
            f"package {label} (entry point '{name}' = {ep.value}) failed to import: "
            f"{describe_exception(exc)}{_where(exc, ep.module)}",
            f"fix or reinstall {dist_name}, or uninstall it (pip uninstall {dist_name}); "
            f"runs that do not use {name}/... are not affected",
        )
        return
    api = getattr(module, "BLOCKS_API", None)
    source = getattr(module, "__file__", None)
    is_package = module.__spec__ is not None and module.__spec__.submodule_search_locations is not None
    # A lone module has no conf/ of its own: one beside it is another distribution's.
    conf = Path(source).parent / "conf" if source and is_package else None
    package = BlockPackage(name, ep.module, dist_name, version, api, conf if conf and conf.is_dir() else None)
    _packages[name] = package
    REGISTRY.package_modules.append(ep.module)
    if not package.compatible:
        declared = f"targets block API {api!r}" if api is not None else "declares no BLOCKS_API"
        _problems[name] = PackageProblem(
            name,
            "incompatible",
            f"package {label} {declared}, but this blocks implements block API {API_VERSION}; "
            f"its blocks are listed but cannot be used",
            f"install a release of {dist_name} made for block API {API_VERSION} "
            f"(its module {ep.module} must set BLOCKS_API = {API_VERSION}, an int)",
        )


def _where(exc: BaseException, module: str) -> str:
    """`` at file:line``: the last frame of the traceback inside the package."""
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return ""
    root = Path(spec.origin).resolve().parent
    where = ""
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        path = Path(frame.f_code.co_filename).resolve()
        if path.is_relative_to(root):
            where = f" at {path}:{lineno}"
    if isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename).resolve().is_relative_to(root):
        where = f" at {exc.filename}:{exc.lineno}"
    return where


def package_of(entry: Entry) -> BlockPackage | None:
    """The package a registered block came from (None for built-ins)."""
    namespace, sep, _ = entry.name.partition("/")
    return _packages.get(namespace) if sep else None


def _choices(overrides: Iterable[str]) -> list[tuple[str, str]]:
    """``(group, option)`` for each option the group choices in *overrides* name (globs unwrapped)."""
    from blocks.core.compose import GROUPS

    found = []
    for override in overrides:
        key, sep, value = override.partition("=")
        group = key.lstrip("+~")
        if not sep or group not in GROUPS:
            continue
        value = re.sub(r"^glob\((.*)\)$", r"\1", value.strip())
        for option in re.split(r"[,\[\]\s]+", value):
            if option.strip("'\""):
                found.append((group, option.strip("'\"")))
    return found


def namespaces_in(overrides: Iterable[str]) -> list[str]:
    """Namespaces that the group choices in *overrides* name (``model=acme/x`` → ``acme``)."""
    found = []
    for _, option in _choices(overrides):
        namespace, slash, _ = option.partition("/")
        if slash and namespace not in found:
            found.append(namespace)
    return found


def refuse_unusable(namespaces: Sequence[str], overrides: Iterable[str] = ()) -> None:
    """Raise a :class:`ConfigError` naming the package when a run uses one (or a block left out of one) that cannot be used."""
    problems = [_problems[n].problem("error") for n in namespaces if n in _problems]
    chosen = {f"{group}={option}" for group, option in _choices(overrides)}
    problems += [p.problem("error") for p in _left_out() if p.option in chosen]
    if problems:
        raise ConfigError(problems)


def refuse_incompatible_blocks(blocks: Iterable[Block]) -> None:
    """Refuse a composition whose blocks come from a package that targets another block API."""
    namespaces = []
    for block in blocks:
        namespace, sep, _ = block.block_name.partition("/")
        if sep and namespace not in namespaces:
            namespaces.append(namespace)
    refuse_unusable(namespaces)
