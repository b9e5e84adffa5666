"""Preemption: SIGTERM or SIGINT stops training at the next optimizer step, on every rank at once.

The signal handler only sets a flag. A single process looks at it at every optimizer-step
boundary. Several processes agree on it (a one-element all-reduce, read back on the host) at
the step boundaries of the logging interval only, where the metrics read the loss anyway, so
no step waits for the device in between; when any rank got the signal, every rank raises
:class:`Preempted` at the same point, so the checkpoint callback saves collectively and the
run ends ``interrupted``. Lightning's own SIGTERM handler is replaced: it runs a collective
inside the signal handler, which deadlocks or desynchronizes ranks that got the signal at
different points of the loop.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import SIGTERMException

from blocks.compat.torch_private import dispatch_hook, processed_micro_batches, replace_signal_handlers

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(SIGTERMException):
    """Every rank agreed to stop: a SIGTERM or SIGINT reached at least one of them."""


class Preemption(pl.Callback):
    """Turns SIGTERM/SIGINT into a synchronized stop at an optimizer-step boundary.

    A second SIGINT (Ctrl-C twice) interrupts at once, without the synchronized stop. A
    process that has not ended *grace_s* seconds after the first signal (``trainer.shutdown_grace_s``)
    ends itself: a rank stuck in a hang, or waiting for a peer that failed, never reaches the
    next step boundary, and torchrun would wait 30 s before killing it whatever the job asked.
    """

    def __init__(self, accumulate: int, every_n_steps: int = 1, grace_s: float | None = None) -> None:
        self.accumulate = accumulate
        self.every = max(1, every_n_steps)
        self.grace_s = grace_s
        self.received: int = 0
        self.stopped_by: str | None = None
        self.interrupted_again = False
        self._deadline: threading.Timer | None = None
        self._previous: dict[int, Any] = {}

    def install(self, trainer: pl.Trainer) -> None:
        """Replace Lightning's signal handling on *trainer* by this flag."""
        replace_signal_handlers(trainer, self.notice, STOP_SIGNALS)

    def arm(self) -> None:
        """Handle the signals from now on; :meth:`disarm` puts the previous handlers back.

        Lightning installs its handlers (this one, see :meth:`install`) only once its loop
        starts, after the data is set up and a checkpoint restored: a SIGTERM in between would
        end the process as signalled, without a ``summary.json``. Noticed from here on, it
        stops the run at its first step, as any other.
        """
        if threading.current_thread() is not threading.main_thread():
            return  # Python installs signal handlers from the main thread only
        self._previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.notice)

    def notice(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: remember the signal; act on it at the next step boundary."""
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            self.interrupted_again = True
            raise KeyboardInterrupt
        if not self.received:
            self.received = signum
            dispatch_hook(self, "on_train_batch_start", True)  # a single process checks from the next step on
            sys.stderr.write(
                f"blocks: {signal.Signals(signum).name} received; stopping after this step and saving a checkpoint\n"
            )
            sys.stderr.flush()
            if self.grace_s is not None:
                self._deadline = threading.Timer(self.grace_s, _end_overdue, (signum, self.grace_s))
                self._deadline.daemon = True
                self._deadline.start()

    def disarm(self) -> None:
        """The run is over: a process that goes on (``blocks.launch.driver.run`` in a notebook) is not ended.

        The grace timer stops, and the handlers :meth:`arm` replaced are back. A signal that
        came after the last step boundary (during the final validation or the weights' save)
        stopped nothing: it is raised again, for the handler it was meant for (the default one
        ends the process, as the sender wanted; a sweep or a pipeline does not go on).
        """
        if self._deadline is not None:
            self._deadline.cancel()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self.received and not self.stopped_by:
            unanswered, self.received = self.received, 0
            signal.raise_signal(unanswered)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A single process with no signal yet has nothing to check at a step: Lightning skips the check until one comes."""
        # Off first, then read the flag: a signal handled in between switches the check back on
        # itself (notice sets the flag before it does), one handled before is seen here.
        dispatch_hook(self, "on_train_batch_start", False)
        if trainer.world_size > 1 or self.received:
            dispatch_hook(self, "on_train_batch_start", True)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """At an optimizer-step boundary, stop on every rank when any rank got a signal.

        With several processes, only at the boundaries of the logging interval (the all-reduce
        is read on the host, a sync with the device).
        """
        if trainer.world_size == 1 and not self.received:
            return  # nothing to agree on: the common case costs one attribute read
        if self.accumulate > 1 and processed_micro_batches(trainer) % self.accumulate:
            return
        if trainer.world_size > 1 and trainer.global_step % self.every:
            return
        signum = agreed(self.received, trainer.strategy.root_device)
        if signum:
            self.stopped_by = signal.Signals(signum).name
            raise Preempted(f"{self.stopped_by} stopped training at step {trainer.global_step}")


def _end_overdue(signum: int, grace_s: float) -> None:
    """End this process: it was still running *grace_s* seconds after signal *signum*.

    Called from a timer thread while the main thread is stuck (in a collective whose peer is
    gone, or in the hang that made a peer give up): raising here would end only the timer
    thread, so the process ends itself, with the status of a process *signum* killed.
    """
    sys.stderr.write(
        f"blocks: still running {grace_s:g}s after {signal.Signals(signum).name} "
        f"(trainer.shutdown_grace_s={grace_s:g}); ending the process\n"
    )
    sys.stderr.flush()
    logging.shutdown()
    os._exit(128 + signum)


def agreed(value: int, device: torch.device) -> int:
    """The largest *value* over all ranks (the value itself without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
