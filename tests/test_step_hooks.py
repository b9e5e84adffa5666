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


def _built(tmp_path: Path, *overrides: str) -> Any:
    """The ``blobs`` recipe built for :data:`STEPS` steps, not yet fitted."""
    plan = driver.prepare(
        [
            "recipe=blobs",
            f"trainer.max_steps={STEPS}",
            "trainer.max_epochs=null",
            "monitor.progress=off",
            *overrides,
        ],
        tmp_path,
    )
    return build_run(plan, tmp_path, console=False)


def _fitted_counting(built: Any) -> Counter[str]:
    """Fit *built* and count each hook dispatch (``[Callback]Owner.hook`` → calls)."""
    profiler = CountingProfiler()
    built.trainer.profiler = profiler
    try:
        built.trainer.fit(built.module, datamodule=built.datamodule)
    finally:
        built.recorder.close()
    return profiler.actions


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


def test_callbacks_are_not_called_at_steps_where_they_have_nothing_to_do(tmp_path: Path) -> None:
    """Under the defaults (``on_nonfinite=stop``, one process) health and preemption skip their step hooks.

    ``stop`` judges logged rows, not steps; the divergence check needs the first step's loss only;
    one process has no stop to agree on until a signal comes. What they do still happens.
    """
    built = _built(tmp_path, "monitor.log_every_n_steps=5")
    actions = _fitted_counting(built)
    assert actions["[Callback]HealthGuard.on_before_optimizer_step"] == 0
    assert actions["[Callback]HealthGuard.on_train_batch_end"] == 1, "the first step's loss only"
    assert actions["[Callback]Preemption.on_train_batch_start"] == 0
    assert actions["[Callback]MetricsRecorder.on_train_batch_end"] == STEPS
    assert built.health.state_dict()["first_loss"] > 0, "the divergence baseline is recorded"
    logged = [int(line.split(",")[0]) for line in (tmp_path / "metrics.csv").read_text().splitlines()[1:]]
    assert logged == [5, 10, 15, 20]


def test_a_policy_that_checks_every_step_is_called_every_step(tmp_path: Path) -> None:
    actions = _fitted_counting(_built(tmp_path, "monitor.on_nonfinite=skip"))
    assert actions["[Callback]HealthGuard.on_before_optimizer_step"] == STEPS


def test_a_signal_in_one_process_stops_training_at_the_next_step(tmp_path: Path) -> None:
    """The skipped preemption check comes back with the signal: training stops at the next step boundary."""
    import signal

    from blocks.runtime.preemption import Preempted

    built = _built(tmp_path)

    class SignalAtStep5(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 5:
                built.preemption.notice(signal.SIGTERM, None)

    built.trainer.callbacks.insert(0, SignalAtStep5())
    try:
        with pytest.raises(Preempted, match="SIGTERM stopped training at step 5"):
            _fitted_counting(built)
    finally:
        built.preemption.disarm()  # no grace timer left to end the test process
    assert built.trainer.global_step == 5
    assert built.preemption.stopped_by == "SIGTERM"


def test_a_signal_while_the_check_is_switched_off_still_stops_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal handled while ``on_train_start`` switches the step check off is not lost.

    CPython runs a signal handler between any two bytecodes; this one is delivered just before
    the check is switched off, after the run found no signal yet.
    """
    import signal

    from blocks.runtime import preemption
    from blocks.runtime.preemption import Preempted

    built = _built(tmp_path)
    switch = preemption.dispatch_hook

    def signalled_first(obj: Any, name: str, wanted: bool) -> None:
        if obj is built.preemption and not wanted and not built.preemption.received:
            built.preemption.notice(signal.SIGTERM, None)
        switch(obj, name, wanted)

    monkeypatch.setattr(preemption, "dispatch_hook", signalled_first)
    try:
        with pytest.raises(Preempted, match="SIGTERM stopped training at step 0"):
            _fitted_counting(built)
    finally:
        built.preemption.disarm()
    assert built.trainer.global_step == 0
