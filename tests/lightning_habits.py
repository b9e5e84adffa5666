"""A team's own Lightning callback, named by import path in ``trainer.callbacks`` by the tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytorch_lightning as pl
import torch


class StepLog(pl.Callback):
    """Writes the optimizer step of every training batch end into *path* (one JSON list)."""

    def __init__(self, path: str, tag: str = "") -> None:
        self.path = Path(path)
        self.tag = tag
        self.steps: list[int] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        self.steps.append(trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.path.write_text(json.dumps({"tag": self.tag, "steps": self.steps}))


class RandomDraws(pl.Callback):
    """Writes ``draws-rank<R>.json`` into the run dir: this rank's torch draws at its first training batch
    (the generator's state put back after) and the seed of its training loader's generator (its workers' base)."""

    def __init__(self) -> None:
        self.draws: list[float] = []

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        if not self.draws:
            state = torch.get_rng_state()
            self.draws = torch.rand(4).tolist()
            torch.set_rng_state(state)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        seed = trainer.train_dataloader.generator.initial_seed()  # type: ignore[union-attr]
        path = Path(trainer.default_root_dir) / f"draws-rank{trainer.global_rank}.json"
        path.write_text(json.dumps({"draws": self.draws, "loader_seed": seed}))


class LogStep(pl.Callback):
    """Logs the optimizer step through Lightning's ``self.log`` after every training batch (as ``habit/step``)."""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object) -> None:
        pl_module.log("habit/step", float(trainer.global_step))


class TeamLearningRateMonitor(pl.callbacks.LearningRateMonitor):
    """A team's own LearningRateMonitor: the plan does not know it needs a logger, Lightning's set-up refuses it without one."""


class LearningRateMonitor(pl.Callback):
    """A team's own callback that shares a name with Lightning's: it needs no logger."""


class RefusesMidRun(pl.Callback):
    """Raises Lightning's ``MisconfigurationException`` after two optimizer steps: a failure in training, not at set-up."""

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        from pytorch_lightning.utilities.exceptions import MisconfigurationException

        if trainer.global_step == 2:
            raise MisconfigurationException("changed its mind")


def not_a_callback() -> None:
    """A function: never a callback."""


class SignalAtSetup(pl.Callback):
    """Sends this process SIGTERM from ``setup``: after the trainer is built, before Lightning's loop starts."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGTERM)


class SignalAtTrainEnd(pl.Callback):
    """Sends this process SIGTERM from ``on_train_end``: after the last step boundary, before the run's end."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGTERM)


class SignalAtStep(pl.Callback):
    """Sends this process *signal_name* (SIGTERM, or SIGINT: a Ctrl-C) once optimizer step *step* is done.

    Sent from ``on_train_batch_end`` at the micro-batch that completes the step, so a run resumed
    from that step (whose first micro-batch ends at the same ``global_step`` under accumulation)
    is not signalled again.
    """

    def __init__(self, step: int, signal_name: str = "SIGTERM") -> None:
        self.step = step
        self.signal_name = signal_name

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object) -> None:
        import os
        import signal

        batch_idx = args[-1]
        completes_a_step = (int(batch_idx) + 1) % trainer.accumulate_grad_batches == 0  # type: ignore[call-overload]
        if trainer.global_step == self.step and completes_a_step:
            os.kill(os.getpid(), signal.Signals[self.signal_name])


class SignalTwiceInStep(pl.Callback):
    """Sends this process SIGINT twice (Ctrl-C twice) in optimizer step *step* + 1, before the optimizer updates."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_before_optimizer_step(self, trainer: pl.Trainer, *args: object) -> None:
        import os
        import signal

        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)


class SignalAgainWhileSaving(pl.Callback):
    """Sends this process SIGINT after optimizer step *step*, and again (Ctrl-C twice) while the checkpoint it stops at is saved."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.sent = 0

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        import os
        import signal

        if trainer.global_step == self.step and not self.sent:
            self.sent = 1
            os.kill(os.getpid(), signal.SIGINT)

    def on_save_checkpoint(self, trainer: pl.Trainer, *args: object) -> None:
        import os
        import signal

        if self.sent == 1:
            self.sent = 2
            os.kill(os.getpid(), signal.SIGINT)


class CtrlCAgainAtExit(pl.Callback):
    """Sends this process SIGINT (a second Ctrl-C) as it exits: from an ``atexit`` callback registered at ``setup``."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        import atexit
        import os
        import signal

        atexit.register(os.kill, os.getpid(), signal.SIGINT)


class KillOwnProcess(pl.Callback):
    """SIGKILLs this process from ``setup`` when ``trainer.max_steps`` is *max_steps* (a crash no handler sees)."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        import os
        import signal

        if trainer.max_steps == self.max_steps:
            os.kill(os.getpid(), signal.SIGKILL)


class CtrlCWhileBuilt(pl.Callback):
    """Raises what a Ctrl-C landing while the run is built raises: KeyboardInterrupt, before its signal handling is armed."""

    def __init__(self) -> None:
        raise KeyboardInterrupt


class ValidatedSteps(pl.Callback):
    """Appends the optimizer step of every validation to ``validated.txt`` in the run dir (one line each, every session)."""

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            with (Path(trainer.default_root_dir) / "validated.txt").open("a") as fh:
                fh.write(f"{trainer.global_step}\n")


class NaNInput(pl.Callback):
    """Fills the floating-point inputs of the training batches of optimizer *steps* (1-based) with NaN: a non-finite loss."""

    def __init__(self, steps: list[int]) -> None:
        self.steps = set(steps)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, *args: object
    ) -> None:
        if trainer.global_step + 1 in self.steps:
            for value in batch.values() if isinstance(batch, dict) else ():
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    value.fill_(float("nan"))
