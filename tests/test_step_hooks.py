"""A training step dispatches only the hooks blocks implements: Lightning skips the no-ops it inherits.

Lightning calls every per-step hook of every callback (and of the module) through a profiler
context, also the base class's empty ones. The dispatches are counted with a profiler that
records each action's name.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytorch_lightning as pl
from pytorch_lightning.profilers import PassThroughProfiler

from blocks.compat.torch_private import STEP_HOOKS
from blocks.launch import driver
from blocks.runtime.trainer import build_run

STEPS = 20


class CountingProfiler(PassThroughProfiler):
    """Counts the actions Lightning profiles (every hook dispatch is one)."""

    def __init__(self) -> None:
        super().__init__()
        self.actions: Counter[str] = Counter()

    def start(self, action_name: str) -> None:
        self.actions[action_name] += 1


def test_a_step_dispatches_only_the_hooks_blocks_implements(tmp_path: Path) -> None:
    plan = driver.prepare(
        ["recipe=blobs", f"trainer.max_steps={STEPS}", "trainer.max_epochs=null", "monitor.progress=off"],
        tmp_path,
    )
    built = build_run(plan, tmp_path, console=False)
    profiler = CountingProfiler()
    built.trainer.profiler = profiler
    built.trainer.fit(built.module, datamodule=built.datamodule)
    built.recorder.close()

    owners = {type(c).__name__: type(c) for c in built.trainer.callbacks}  # type: ignore[attr-defined]
    owners[type(built.module).__name__] = type(built.module)
    bases = {
        name: pl.LightningModule if name == type(built.module).__name__ else pl.Callback for name in owners
    }
    dispatched = [
        (owner, hook)
        for action in profiler.actions
        if action.startswith(("[Callback]", "[LightningModule]"))
        for owner, _, hook in [action.split("]", 1)[1].rpartition(".")]
        if hook in STEP_HOOKS
    ]
    assert dispatched, "the profiler sees the hook dispatches"
    inherited = [
        (owner, hook)
        for owner, hook in dispatched
        if getattr(owners[owner], hook) is getattr(bases[owner], hook)
    ]
    assert not inherited, inherited
