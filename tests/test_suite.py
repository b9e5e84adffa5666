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


def test_tests_and_the_processes_they_start_run_torch_on_one_thread() -> None:
    """A thread per core in every test process made each parallel op wait for a descheduled peer (10 s -> 166 s)."""
    import os

    import torch

    assert os.environ["OMP_NUM_THREADS"] == "1" and torch.get_num_threads() == 1


def test_a_job_whose_output_fills_the_pipe_still_exits_once_the_test_reads_on() -> None:
    """After the step it waits for, blocks_run_until_step stops reading: a full pipe would block the job.

    Multiprocessing's resource tracker, writing its warnings after a kill -9, never exited.
    """
    import subprocess
    import sys

    from tests.conftest import DrainedPopen, spawned

    chatty = "print('ready', flush=True); print('x' * 1000 * 1000, flush=True)"
    with spawned(
        [sys.executable, "-c", chatty], popen=DrainedPopen, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert isinstance(proc, DrainedPopen) and proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.keep_reading()
        assert proc.wait(timeout=60) == 0
        out, _ = proc.communicate(timeout=60)
        assert len(out) == 1000 * 1000 + 1
