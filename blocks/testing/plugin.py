"""The pytest plugin of the conformance kit (entry point ``pytest11``: ``blocks``).

Installed with ``blocks``, it gives every test session the ``blocks_kit`` fixture.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from blocks.testing import Kit


@pytest.fixture
def blocks_kit(tmp_path: Path) -> Kit:
    """The conformance checks, running their ``blocks run`` subprocesses in a temporary directory."""
    return Kit(tmp_path)
