"""``monitor.on_nonfinite=skip`` with fused AdamW skips a bad step on the device: no host read per step.

NaN is written into one gradient at chosen optimizer steps (a test callback placed before
blocks' own). The fused run (``optim.fused=true``, on the CPU: torch 2.13 has fused AdamW
kernels for it) and the host-checked run (``optim.fused=false``) must skip the same steps,
leave the parameters unchanged on exactly those steps, and report the same count; the fused
one must read no tensor on the host between logged steps (the count of
``tests/test_step_syncs.py``).
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch

from blocks.launch import driver
from blocks.runtime.health import NonFiniteError, skips_on_device
from blocks.runtime.trainer import BuiltRun, build_run
from blocks.spec.errors import PlanError

HOST_READS = ("item", "__float__", "__bool__", "__int__", "__index__", "tolist", "cpu", "numpy")
LOG_EVERY = 10
STEPS = 30
BAD_STEPS = {3, 4, 12}
"""Optimizer steps (1-based, as ``global_step`` after them) whose gradients get a NaN."""


class InjectNaN(pl.Callback):
    """Writes NaN into the first parameter's gradient at the optimizer steps in *bad*; keeps every step's weights.

    The loss stays finite: only the gradients are not. Each step's loss (the sum of its
    micro-batches', already divided by the accumulation count) is kept on the device.
    """

    def __init__(self, bad: set[int]) -> None:
        self.bad = bad
        self.before: dict[int, list[torch.Tensor]] = {}
        self.after: dict[int, list[torch.Tensor]] = {}
        self.losses: dict[int, torch.Tensor] = {}
        self._pending: torch.Tensor | None = None
        self._seen_step = 0

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        step = trainer.global_step + 1
        self.before[step] = [p.detach().clone() for p in pl_module.parameters()]
        if step in self.bad:
            grad = next(p.grad for p in pl_module.parameters() if p.grad is not None)
            grad.view(-1)[0] = float("nan")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, *args: Any
    ) -> None:
        loss = outputs["loss"].detach().clone()
        self._pending = loss if self._pending is None else self._pending + loss
        if trainer.global_step != self._seen_step:  # the optimizer step just ended
            self.losses[trainer.global_step], self._pending = self._pending, None
            self._seen_step = trainer.global_step
        self.after[trainer.global_step] = [p.detach().clone() for p in pl_module.parameters()]

    def counted_mean_losses(self, every: int) -> dict[int, float]:
        """Per logged step, the mean loss over the window's steps that were not skipped (read after training)."""
        return {
            end: statistics.mean(
                float(self.losses[step]) for step in range(end - every + 1, end + 1) if step not in self.bad
            )
            for end in range(every, STEPS + 1, every)
        }

    def unchanged_steps(self) -> set[int]:
        """Steps after which every parameter equals what it was before the step (read after training)."""
        return {
            step
            for step, before in self.before.items()
            if all(torch.equal(a, b) for a, b in zip(before, self.after[step], strict=True))
        }


def _built(run_dir: Path, fused: bool, extra: tuple[str, ...] = ()) -> BuiltRun:
    plan = driver.prepare(
        [
            "recipe=blobs",
            "optim=adamw",
            f"optim.fused={str(fused).lower()}",
            "monitor.on_nonfinite=skip",
            f"trainer.max_steps={STEPS}",
            "trainer.max_epochs=null",
            f"monitor.log_every_n_steps={LOG_EVERY}",
            "monitor.progress=off",
            "checkpoint.enabled=false",
            *extra,
        ],
        run_dir,
    )
    return build_run(plan, run_dir, console=False)


def _logged_losses(built: BuiltRun) -> dict[int, float]:
    """``train/loss`` by step from the run's ``metrics.csv``."""
    with (Path(built.trainer.default_root_dir) / "metrics.csv").open(newline="") as fh:
        return {int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(fh) if row["train/loss"]}


def _train(built: BuiltRun, injector: InjectNaN) -> None:
    built.trainer.callbacks.insert(0, injector)  # type: ignore[attr-defined]
    try:
        built.trainer.fit(built.module, datamodule=built.datamodule)
    finally:
        built.recorder.close()


@pytest.fixture(scope="module")
def fused_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[BuiltRun, InjectNaN, Counter[Any]]:
    """The fused run, every host read of a tensor booked under the optimizer step it happened in."""
    built = _built(tmp_path_factory.mktemp("fused"), fused=True)
    injector = InjectNaN(BAD_STEPS)
    calls: Counter[Any] = Counter()
    patch = pytest.MonkeyPatch()

    def wrapped(name: str) -> Any:
        original = getattr(torch.Tensor, name)

        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            caller = Path(sys._getframe(1).f_code.co_filename).as_posix()
            if "torch/optim" not in caller and "test_skip_without_sync" not in caller:
                where = "validation" if built.trainer.validating else built.trainer.global_step
                calls[(where, name, Path(caller).name)] += 1
            return original(self, *args, **kwargs)

        return read

    for name in HOST_READS:
        patch.setattr(torch.Tensor, name, wrapped(name))
    try:
        _train(built, injector)
    finally:
        patch.undo()
    return built, injector, calls


def test_fused_adamw_skips_on_the_device_without_a_host_read_between_logged_steps(
    fused_run: tuple[BuiltRun, InjectNaN, Counter[Any]],
) -> None:
    built, _, calls = fused_run
    assert skips_on_device(built.trainer.optimizers[0])
    between = [key for key in calls if isinstance(key[0], int) and key[0] % LOG_EVERY]
    assert not between, sorted(calls.items(), key=str)
    assert any(key[0] == LOG_EVERY for key in calls)  # the count does see the reads of a logged step


def test_the_bad_steps_leave_the_weights_alone_and_count_as_on_the_host_checked_path(
    fused_run: tuple[BuiltRun, InjectNaN, Counter[Any]], tmp_path: Path
) -> None:
    built, injector, _ = fused_run
    assert injector.unchanged_steps() == BAD_STEPS
    assert built.recorder.last["health/skipped_steps"] == len(BAD_STEPS)
    assert all(bool(torch.isfinite(p).all()) for p in built.module.parameters())
    # a skipped step's loss is finite (only its gradients are not), and still does not count
    assert _logged_losses(built) == pytest.approx(injector.counted_mean_losses(LOG_EVERY), rel=1e-4)

    # the host-checked path, with accumulation: the verdict comes after the step's first micro-batch
    synced = _built(tmp_path, fused=False, extra=("optim.accumulate=2",))
    checked = InjectNaN(BAD_STEPS)
    _train(synced, checked)
    assert not skips_on_device(synced.trainer.optimizers[0])
    assert checked.unchanged_steps() == BAD_STEPS
    assert synced.recorder.last["health/skipped_steps"] == built.recorder.last["health/skipped_steps"]
    assert _logged_losses(synced) == pytest.approx(checked.counted_mean_losses(LOG_EVERY), rel=1e-4)


@pytest.mark.parametrize("fused", [True, False], ids=["on-the-device", "on-the-host"])
def test_a_skipped_first_step_is_not_the_divergence_baseline(tmp_path: Path, fused: bool) -> None:
    """Regression: the first step's loss became the baseline even when the step was skipped (here its
    loss is finite and only its gradients are not); the first counted step's loss is the baseline."""
    built = _built(tmp_path, fused=fused)
    injector = InjectNaN({1})
    _train(built, injector)
    assert built.health is not None
    first, second = float(injector.losses[1]), float(injector.losses[2])
    assert first != second
    assert built.health.state_dict()["first_loss"] == second


def test_too_many_bad_steps_in_a_row_fail_the_run_at_the_next_logged_step(tmp_path: Path) -> None:
    built = _built(tmp_path, fused=True, extra=("monitor.max_bad_steps=2",))
    with pytest.raises(NonFiniteError, match=r"3 optimizer steps in a row.*monitor.max_bad_steps=2"):
        _train(built, InjectNaN({5, 6, 7}))
    assert built.trainer.global_step == LOG_EVERY


def test_only_fused_adam_skips_on_the_device() -> None:
    params = [torch.nn.Parameter(torch.ones(2))]
    assert skips_on_device(torch.optim.AdamW(params, fused=True))
    assert skips_on_device(torch.optim.Adam(params, fused=True))
    assert not skips_on_device(torch.optim.AdamW(params, fused=False))
    # torch's fused SGD leaves its momentum buffer uninitialised when the first step is skipped
    assert not skips_on_device(torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True))


def test_fused_with_clipping_under_mixed_precision_is_a_plan_error_and_auto_falls_back(
    tmp_path: Path,
) -> None:
    mixed = ["recipe=blobs", "precision=bf16-mixed", "optim.grad_clip=1.0"]
    with pytest.raises(PlanError) as error:
        driver.prepare([*mixed, "optim.fused=true"], tmp_path / "explicit")
    assert "optim.fused" in str(error.value) and "optim.grad_clip=null" in str(error.value)
    built = build_run(driver.prepare(mixed, tmp_path / "auto"), tmp_path / "auto", console=False)
    assert built.module.optim_block.fused is False  # type: ignore[attr-defined]
