"""A callback module that records whether Python's garbage collector was enabled while it was imported."""

from __future__ import annotations

import gc

import pytorch_lightning as pl

COLLECTOR_ENABLED_AT_IMPORT = gc.isenabled()


class Noop(pl.Callback):
    """Does nothing: its module's import is what the test looks at."""
