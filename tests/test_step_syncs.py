"""The default training step never waits for the device: host reads of tensors happen at logged steps only.

A CUDA-free count: every way of reading a tensor on the host (``item``, ``float``, ``bool``,
``int``, ``tolist``, ``cpu``, ``numpy``) is wrapped during an in-process run, and each call is
booked under the optimizer step it happened in. On a GPU each of them waits for the device.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from blocks.launch import driver
from blocks.runtime.trainer import build_run

HOST_READS = ("item", "__float__", "__bool__", "__int__", "__index__", "tolist", "cpu", "numpy")
LOG_EVERY = 10
STEPS = 40


def _count_host_reads(monkeypatch: pytest.MonkeyPatch, run_dir: Path, overrides: list[str]) -> Counter[Any]:
    """Train and return ``(step or "validation", read, caller)`` → calls."""
    calls: Counter[Any] = Counter()
    current: dict[str, Any] = {}

    def wrapped(name: str) -> Any:
        original = getattr(torch.Tensor, name)

        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            trainer = current.get("trainer")
            caller = sys._getframe(1).f_code.co_filename
            # torch.optim's step counters live on the host (not capturable): reading them never syncs.
            if trainer is not None and f"torch{Path('/').as_posix()}optim" not in Path(caller).as_posix():
                where = "validation" if trainer.validating else trainer.global_step
                calls[(where, name, Path(caller).name)] += 1
            return original(self, *args, **kwargs)

        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, wrapped(name))
    plan = driver.prepare(
        [
            "recipe=blobs",
            f"trainer.max_steps={STEPS}",
            "trainer.max_epochs=null",
            f"monitor.log_every_n_steps={LOG_EVERY}",
            "monitor.progress=off",
            *overrides,
        ],
        run_dir,
    )
    built = build_run(plan, run_dir, console=False)
    current["trainer"] = built.trainer
    try:
        built.trainer.fit(built.module, datamodule=built.datamodule)
    finally:
        built.recorder.close()
    return calls


def _between_logged_steps(calls: Counter[Any]) -> list[Any]:
    return [key for key in calls if isinstance(key[0], int) and key[0] % LOG_EVERY]


def test_the_default_step_reads_nothing_back_between_logged_steps(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _count_host_reads(monkeypatch, tmp_path, [])
    assert not _between_logged_steps(calls), sorted(calls.items(), key=str)
    logged = {key[0] for key in calls if isinstance(key[0], int)}
    assert logged <= set(range(0, STEPS + 1, LOG_EVERY))
    assert LOG_EVERY in logged  # the loss is read at the logging interval (the count sees the reads)
