"""A training step dispatches only the hooks blocks implements: Lightning skips the no-ops it inherits.

Lightning calls every per-step hook of every callback (and of the module) through a profiler
context, also the base class's empty ones. The dispatches are counted with a profiler that
records each action's name.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
from pytorch_lightning.profilers import PassThroughProfiler
from torch import nn

from blocks.compat.torch_private import BATCH_HOOKS, STEP_HOOKS
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


def _built(tmp_path: Path) -> Any:
    """The ``blobs`` recipe built for :data:`STEPS` steps, not yet fitted."""
    plan = driver.prepare(
        ["recipe=blobs", f"trainer.max_steps={STEPS}", "trainer.max_epochs=null", "monitor.progress=off"],
        tmp_path,
    )
    return build_run(plan, tmp_path, console=False)


def test_a_step_dispatches_only_the_hooks_blocks_implements(tmp_path: Path) -> None:
    built = _built(tmp_path)
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
    batch_hooks = [action for action in profiler.actions if action.endswith(BATCH_HOOKS)]
    assert not batch_hooks, f"blocks overrides no batch hook, yet Lightning dispatched {batch_hooks}"


def test_a_step_writes_no_module_attribute_through_nn_module_setattr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning names the running hook on the module ~34 times a step; none goes through ``nn.Module.__setattr__``."""
    built = _built(tmp_path)
    writes: Counter[str] = Counter()
    module_setattr = nn.Module.__setattr__

    def counting(self: nn.Module, name: str, value: Any) -> None:
        if self is built.module:
            writes[name] += 1
        module_setattr(self, name, value)

    monkeypatch.setattr(nn.Module, "__setattr__", counting)
    built.trainer.fit(built.module, datamodule=built.datamodule)
    built.recorder.close()
    assert built.module._current_fx_name is None, "Lightning still names its hooks in _current_fx_name"
    assert sum(writes.values()) < STEPS, f"per-step writes through nn.Module.__setattr__: {writes}"


def test_without_a_profiler_every_hook_call_enters_one_shared_no_op_context(tmp_path: Path) -> None:
    """Lightning wraps each hook call in ``profiler.profile``; with nothing to profile that costs no new object."""
    built = _built(tmp_path)
    profiler = built.trainer.profiler
    assert isinstance(profiler, PassThroughProfiler)
    assert profiler.profile("[Callback]a.on_train_batch_end") is profiler.profile(
        "[LightningModule]b.training_step"
    )
    built.trainer.fit(built.module, datamodule=built.datamodule)
    built.recorder.close()
    assert built.trainer.global_step == STEPS


def test_training_step_signature_is_read_once_not_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning asks ``inspect`` before every batch whether ``training_step`` takes ``batch_idx``."""
    import inspect

    built = _built(tmp_path)
    readings: list[str] = []
    getfullargspec = inspect.getfullargspec

    def counting(func: Any) -> inspect.FullArgSpec:
        readings.append(getattr(func, "__name__", repr(func)))
        return getfullargspec(func)

    monkeypatch.setattr(inspect, "getfullargspec", counting)
    seen: list[int] = []
    training_step = built.module.training_step

    def recording(batch: Any, batch_idx: int) -> Any:
        seen.append(batch_idx)
        return training_step(batch, batch_idx)

    built.module.training_step = recording  # type: ignore[method-assign]
    built.trainer.fit(built.module, datamodule=built.datamodule)
    built.recorder.close()
    assert seen == list(range(len(seen))) and len(seen) == STEPS, "training_step gets each batch_idx"
    assert sum(name in ("training_step", "recording") for name in readings) < STEPS, readings
