"""``trainer.callbacks``: Lightning callbacks named by import path, checked before anything is imported.

Each entry is ``{_target_: package.module.Class, arg: value, ...}``. The class goes through the
same import seam as every other path a config names (:mod:`blocks.spec.imports`): at plan time
the string is checked (allowed prefix, never a refused module), and ``blocks run`` imports it
before anything starts and checks it is a Lightning ``Callback`` class. Lightning's own
callbacks (``pytorch_lightning.callbacks``) need no permission.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from blocks.spec.imports import TARGET_KEY, Kind, entry_import_paths, report_import_paths, subclass_of

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext

CALLBACK_CLASS = Kind(
    "a Lightning Callback class (pytorch_lightning.Callback)",
    subclass_of("pytorch_lightning.callbacks.callback.Callback"),
    also_allowed=("pytorch_lightning.callbacks",),
)
"""What a ``trainer.callbacks[i]._target_`` must name."""

OWNED_BY_BLOCKS = {
    "ModelCheckpoint": ("the checkpoint block saves checkpoints", "checkpoint.every_n_steps=100"),
    "TQDMProgressBar": ("monitor.progress draws the progress", "monitor.progress=bar"),
    "RichProgressBar": ("monitor.progress draws the progress", "monitor.progress=bar"),
}
"""Lightning callbacks whose job a block does (the Trainer is built without them), with the block's key."""

NEEDS_A_LOGGER = ("LearningRateMonitor", "DeviceStatsMonitor")
"""Lightning callbacks that log through the Trainer's loggers and refuse a Trainer without one."""

LIGHTNING_CALLBACKS = ("pytorch_lightning.callbacks.", "lightning.pytorch.callbacks.")
"""Where Lightning's own callbacks live: only there does a class name say what the class does."""

METRIC_ARGUMENT = "monitor"
"""The argument Lightning's metric-watching callbacks (EarlyStopping, ...) name a metric in."""


def callback_paths(callbacks: list[Any]) -> list[tuple[str, str, Kind]]:
    """Every import path of *callbacks*: each entry's class and the nested ``_target_`` of its arguments."""
    paths: list[tuple[str, str, Kind]] = []
    for i, entry in enumerate(callbacks):
        if not isinstance(entry, Mapping) or not isinstance(entry.get(TARGET_KEY), str):
            continue
        paths += entry_import_paths(entry, f"trainer.callbacks[{i}]", CALLBACK_CLASS)
    return paths


def lightning_callback_name(target: str) -> str | None:
    """The class name of *target* when it is one of Lightning's own callbacks, else None (a team's namesake)."""
    return target.rsplit(".", 1)[-1] if target.startswith(LIGHTNING_CALLBACKS) else None


def check_callbacks(ctx: CheckContext, callbacks: list[Any]) -> None:
    """Each entry names an allowed class with ``_target_``; a ``monitor`` argument names a logged metric."""
    for i, entry in enumerate(callbacks):
        field = f"trainer.callbacks[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get(TARGET_KEY), str):
            ctx.error(
                field,
                "a callback is {_target_: <import path of a Lightning Callback class>, <argument>: <value>, ...}",
                "trainer.callbacks=[{_target_: pytorch_lightning.callbacks.EarlyStopping, monitor: val/loss}]",
                check="import-path",
            )
            continue
        target = entry[TARGET_KEY]
        name = lightning_callback_name(target)
        owned = OWNED_BY_BLOCKS.get(name or "")
        if owned is not None:
            ctx.error(
                f"{field}.{TARGET_KEY}",
                f"'{target}' is not used: {owned[0]}",
                f"remove it from trainer.callbacks and set {owned[1]}",
                check="callback-owned-by-block",
            )
        if name in NEEDS_A_LOGGER and not _has_lightning_logger(ctx):
            ctx.error(
                f"{field}.{TARGET_KEY}",
                f"'{target}' logs through a Lightning logger, and monitor.loggers has none "
                "(csv is metrics.csv, written by blocks, not a Lightning logger)",
                "add one, e.g. monitor.loggers=[csv,tensorboard], or remove the callback from trainer.callbacks",
                check="callback-needs-logger",
                related=("monitor.loggers",),
            )
        report_import_paths(ctx, entry_import_paths(entry, field, CALLBACK_CLASS))
        args = {k: v for k, v in entry.items() if k != TARGET_KEY}
        metric = args.get(METRIC_ARGUMENT)
        if isinstance(metric, str):
            ctx.monitored_metric(
                f"{field}.{METRIC_ARGUMENT}",
                metric,
                check="callback-metric",
                validation_check="callback-validation",
            )


def _has_lightning_logger(ctx: CheckContext) -> bool:
    """Whether ``monitor.loggers`` names a Lightning logger the Trainer gets (anything but ``csv``)."""
    return any(entry != "csv" for entry in ctx.monitor.loggers)
