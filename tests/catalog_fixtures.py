"""A clean catalog for a test: blocks' own blocks and shipped recipes, and nothing else.

Test modules register blocks and recipes of their own; in one pytest process (an xdist
worker runs many modules) those land in the default registry. A test that needs to know the
built-ins takes :func:`fresh_catalog` (at collection time) or the ``clean_catalog`` fixture,
instead of filtering out what other modules added. A test that needs installed block
packages takes ``fake_site``, which installs them for that test only.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from blocks.core import catalog as catalog_module
from blocks.core import packages
from blocks.core.catalog import Catalog, build_catalog
from blocks.core.recipe import RECIPES
from blocks.spec.registry import REGISTRY


def fresh_catalog() -> Catalog:
    """A catalog of blocks' own blocks and shipped recipes: no installed package, no project, no test's blocks."""
    return build_catalog(with_packages=False, with_project=False)


@pytest.fixture
def clean_catalog() -> Iterator[Catalog]:
    """A fresh catalog, active for the test: ``@register``/``@recipe`` inside the test add to it only."""
    catalog = fresh_catalog()
    with catalog.active():
        yield catalog


class FakeSite:
    """A directory on ``sys.path`` where :meth:`install` puts block packages as pip would (dist-info included)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def install(self, dist: str, version: str, entry_points: dict[str, str], files: dict[str, str]) -> None:
        """Write *files* (path under the site → source) and a dist-info declaring *entry_points* in ``[blocks]``."""
        for relative, text in files.items():
            path = self.root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        points = "".join(f"{name} = {module}\n" for name, module in entry_points.items())
        (info / "entry_points.txt").write_text(f"[blocks]\n{points}")
        (info / "RECORD").write_text("")


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    """Block packages installed for one test, discovered in this process by the next CLI call.

    Package discovery, the default registry, recipe book and catalog are process-wide: the
    fixture starts them afresh for the test and puts every one back after it, with ``sys.path``
    and the modules the packages imported.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    for name, value in [("_discovered", False), ("_packages", {}), ("_problems", {})]:
        monkeypatch.setattr(packages, name, value)
    monkeypatch.setattr(catalog_module, "_default", None)
    monkeypatch.setattr(catalog_module, "_problems", dict(catalog_module._problems))
    for book in (REGISTRY, RECIPES):
        monkeypatch.setattr(book, "owner", book.owner)
    monkeypatch.setattr(REGISTRY, "package_modules", list(REGISTRY.package_modules))
    monkeypatch.setattr(REGISTRY, "rejected", list(getattr(REGISTRY, "rejected", [])), raising=False)
    monkeypatch.setattr(
        REGISTRY, "_entries", {kind: dict(names) for kind, names in REGISTRY._entries.items()}
    )
    monkeypatch.setattr(RECIPES, "_entries", dict(RECIPES._entries))
    modules = set(sys.modules)
    try:
        yield FakeSite(site)
    finally:
        for name in set(sys.modules) - modules:
            del sys.modules[name]
        importlib.invalidate_caches()
