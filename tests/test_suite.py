"""The suite's own machinery: pytest-xdist keeps each group of tests on one worker."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("suite")
def test_grouped_tests_carry_their_group_to_the_xdist_scheduler(request: pytest.FixtureRequest) -> None:
    """``--dist loadgroup`` schedules by the ``@group`` suffix that xdist adds to a grouped test's id.

    pytest 9.2 ignores the way pytest-xdist 3.8 adds it (node ids became structured), and every
    group was silently spread over the workers: torchrun tests ran two at a time, and a module's
    shared run dir was trained once per worker.
    """
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("checks pytest -n N --dist loadgroup (nox -s tests)")
    assert request.node.nodeid.endswith("@suite"), (
        f"{request.node.nodeid}: no group, so xdist does not keep it"
    )
