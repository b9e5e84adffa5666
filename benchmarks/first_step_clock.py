"""A Lightning callback that writes the wall-clock time at which the first training step ended.

Both sides of the time-to-first-step benchmark load it: ``blocks run`` through
``trainer.callbacks`` and the hand-written Lightning script directly. The file to write is named by
:data:`benchmarks.harness.FIRST_STEP_FILE_ENV`; the benchmark subtracts the time it started the
process, so neither the interpreter's exit nor anything after the first step is counted.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytorch_lightning as pl

from benchmarks.harness import FIRST_STEP_FILE_ENV


class FirstStepClock(pl.Callback):
    """Writes ``time.time()`` to ``$BLOCKS_BENCHMARK_FIRST_STEP_FILE`` when the first training batch ends."""

    def __init__(self) -> None:
        self.written = False

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        """Record the first step's end, once."""
        if not self.written:
            self.written = True
            with open(os.environ[FIRST_STEP_FILE_ENV], "w") as out:
                out.write(repr(time.time()))
