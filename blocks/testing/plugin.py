"""The pytest plugin of the conformance kit (entry point ``pytest11``: ``blocks``).

Installed with ``blocks``, it gives every test session the ``blocks_kit`` fixture, and the ini
option ``blocks_kit_in_process``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from blocks.testing import Kit

IN_PROCESS_INI = "blocks_kit_in_process"


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ini option ``blocks_kit_in_process``."""
    parser.addini(
        IN_PROCESS_INI,
        "blocks_kit trains in the test's process instead of blocks run subprocesses "
        "(faster; a subprocess contains a block that crashes its process)",
        type="bool",
        default=False,
    )


@pytest.fixture
def blocks_kit(tmp_path: Path, request: pytest.FixtureRequest) -> Kit:
    """The conformance checks, their runs in a temporary directory (in this process with ``blocks_kit_in_process``)."""
    return Kit(tmp_path, in_process=bool(request.config.getini(IN_PROCESS_INI)))
