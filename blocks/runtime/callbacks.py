"""The Lightning callbacks of ``trainer.callbacks``, built through the import seam, and what they did."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import EarlyStopping
from pytorch_lightning.callbacks.early_stopping import EarlyStoppingReason

from blocks.spec.errors import BlocksError, Problem
from blocks.spec.imports import TARGET_KEY, instantiate, resolve
from blocks.trainer.callbacks import CALLBACK_CLASS


def build_callbacks(entries: list[Any]) -> list[pl.Callback]:
    """One callback per ``{_target_: ..., args}`` entry: the class checked (a ``Callback``), then built."""
    built = []
    for i, entry in enumerate(entries):
        key = f"trainer.callbacks[{i}]"
        cls = resolve(entry[TARGET_KEY], f"{key}.{TARGET_KEY}", kind=CALLBACK_CLASS)
        args = instantiate({k: v for k, v in dict(entry).items() if k != TARGET_KEY}, key)
        try:
            built.append(cls(**args))
        except Exception as exc:
            raise BlocksError(
                Problem(
                    key,
                    f"{entry[TARGET_KEY]} could not be built: {type(exc).__name__}: {exc}",
                    f"give {key} the arguments {cls.__name__} takes",
                    check="callback-refused",
                )
            ) from None
    return built


SET_UP_HOOKS = frozenset({"setup", "on_fit_start", "on_train_start", "on_sanity_check_start"})
"""The hooks a callback checks its Trainer in, before any training step: a refusal there means the run could not start."""


def refused_by_callback(exc: BaseException, users: list[pl.Callback]) -> BlocksError | None:
    """*exc* as a problem on ``trainer.callbacks[i]`` when callback *i* raised it in a set-up hook, else None.

    Lightning's own callbacks check the Trainer they are given (a ``MisconfigurationException``,
    e.g. a ``LearningRateMonitor`` without a logger) in their set-up hooks, after blocks' plan.
    """
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    if not isinstance(exc, MisconfigurationException):
        return None
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        for i, callback in enumerate(users):
            if owner is callback and tb.tb_frame.f_code.co_name in SET_UP_HOOKS:
                key = f"trainer.callbacks[{i}]"
                fix = f"correct or remove {key}"
                if "logger" in str(exc).lower():
                    fix = f"give it a Lightning logger (e.g. monitor.loggers=[csv,tensorboard]), or remove {key}"
                return BlocksError(
                    Problem(
                        key,
                        f"{type(callback).__name__} refused the run: {exc}",
                        fix,
                        check="callback-refused",
                        related=("monitor.loggers",),
                    )
                )
        tb = tb.tb_next
    return None


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
