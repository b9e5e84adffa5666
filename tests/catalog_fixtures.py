"""A clean catalog for a test: blocks' own blocks and shipped recipes, and nothing else.

Test modules register blocks and recipes of their own; in one pytest process (an xdist
worker runs many modules) those land in the default registry. A test that needs to know the
built-ins takes :func:`fresh_catalog` (at collection time) or the ``clean_catalog`` fixture,
instead of filtering out what other modules added.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from blocks.core.catalog import Catalog, build_catalog


def fresh_catalog() -> Catalog:
    """A catalog of blocks' own blocks and shipped recipes: no installed package, no project, no test's blocks."""
    return build_catalog(with_packages=False, with_project=False)


@pytest.fixture
def clean_catalog() -> Iterator[Catalog]:
    """A fresh catalog, active for the test: ``@register``/``@recipe`` inside the test add to it only."""
    catalog = fresh_catalog()
    with catalog.active():
        yield catalog
