"""The Lightning callbacks of ``trainer.callbacks``, built through the import seam, and what they did."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import EarlyStopping
from pytorch_lightning.callbacks.early_stopping import EarlyStoppingReason

from blocks.spec.imports import TARGET_KEY, instantiate, resolve
from blocks.trainer.callbacks import CALLBACK_CLASS


def build_callbacks(entries: list[Any]) -> list[pl.Callback]:
    """One callback per ``{_target_: ..., args}`` entry: the class checked (a ``Callback``), then built."""
    built = []
    for i, entry in enumerate(entries):
        key = f"trainer.callbacks[{i}]"
        cls = resolve(entry[TARGET_KEY], f"{key}.{TARGET_KEY}", kind=CALLBACK_CLASS)
        args = instantiate({k: v for k, v in dict(entry).items() if k != TARGET_KEY}, key)
        built.append(cls(**args))
    return built


def early_stop_reason(trainer: pl.Trainer, total_steps: int) -> str | None:
    """Why training ended before ``total_steps`` when an EarlyStopping callback stopped it, else None."""
    if trainer.global_step >= total_steps:
        return None
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if (
            isinstance(callback, EarlyStopping)
            and callback.stopping_reason != EarlyStoppingReason.NOT_STOPPED
        ):
            message = (callback.stopping_reason_message or "").replace(" Signaling Trainer to stop.", "")
            return f"stopped early by EarlyStopping at step {trainer.global_step} of {total_steps}: {message}"
    return None
