"""The monitor kind: what a run reports while it trains, how often, and what it does when training goes wrong."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from blocks.spec.block import Block
from blocks.spec.imports import (
    TARGET_KEY,
    Kind,
    entry_import_paths,
    path_problem,
    report_import_paths,
    subclass_of,
    targets_in,
)
from blocks.spec.registry import register

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext

PROGRESS = ("auto", "bar", "lines", "off")
NONFINITE_POLICIES = ("stop", "skip", "rollback")
BUILTIN_LOGGERS = ("csv", "tensorboard")
OBJECTIVE_MODES = ("min", "max")
LOGGER_CLASS = Kind(
    "a Lightning logger class",
    subclass_of("pytorch_lightning.loggers.logger.Logger", "lightning.pytorch.loggers.logger.Logger"),
    also_allowed=("pytorch_lightning.loggers", "lightning.pytorch.loggers"),
)
"""What a ``monitor.loggers`` import path must name (Lightning's own loggers need no permission)."""


@dataclass(frozen=True, kw_only=True)
class MonitorBlock(Block):
    """Base of monitor blocks: the fields the plan, build and launch layers read.

    A monitor block of another package subclasses this base and gets the same treatment as the
    built-in: every layer reads only what is declared here.

    Attributes:
        log_every_n_steps: optimizer steps between rows of ``metrics.csv`` and progress updates;
            also the Trainer's ``log_every_n_steps`` (``LearningRateMonitor``, a callback's ``self.log``).
        progress: ``auto`` (a live bar on a terminal, plain lines otherwise), ``bar``,
            ``lines`` or ``off``.
        grad_norm: log the global gradient norm (before clipping) at each logged step.
        rank_spread_tolerance: with several processes, warn when the ranks' training losses
            differ by more than this fraction of their mean ((max - min) / mean).
        loggers: Lightning loggers the metric rows go to besides ``metrics.csv`` (always
            written; ``csv`` names it): ``tensorboard`` (a ``TensorBoardLogger`` writing into
            ``<run dir>/tensorboard``), the import path of any Lightning logger class
            (``pytorch_lightning.loggers.MLFlowLogger``), built with ``logger_args``, or
            ``{_target_: <import path>, <argument>: <value>}`` to give several loggers their
            own arguments. Each gets the resolved config as hyperparameters and continues its
            run on resume.
        logger_args: keyword arguments of the Lightning logger class named by its path in ``loggers``.
        on_nonfinite: a non-finite loss or gradient: ``stop`` the run (status ``failed``),
            ``skip`` the optimizer step, or ``rollback`` to the last committed checkpoint and
            go on with the next batches. ``skip`` and ``rollback`` check every step (one
            device sync per step); ``stop`` checks at each logged step.
        max_bad_steps: with ``skip``/``rollback``, fail the run after this many non-finite
            steps in a row (0: never).
        grad_spike_factor: warn when the gradient norm of a logged step exceeds this many
            times the running median of the last logged norms (0: off).
        loss_divergence_factor: a finite logged ``train/loss`` above this many times the loss
            of the run's first counted step (finite, and not dropped by ``skip`` or
            ``rollback``) is divergence, handled like a non-finite step by
            ``on_nonfinite``: ``stop`` fails the run, ``rollback`` rolls back to the last valid
            checkpoint, ``skip`` warns (0: off; only for losses whose first value is positive).
        stall_timeout_s: when no training or validation batch finishes for this many seconds,
            every rank dumps its Python stacks into ``<run dir>/stacks/`` and the job fails,
            so torchrun's restarts (``trainer.max_failures``) can take over, or a sweep goes on
            with its next job (0: off).
        objective: the metric a run returns to Hydra's sweeper (e.g. Optuna); a minimized one
            falls back to ``train/loss`` when the run has no such metric. A validation metric
            without a validation split is a plan error when maximized, a warning otherwise.
        objective_mode: ``min`` or ``max``: how ``blocks report`` ranks a sweep's jobs.
        peak_flops: peak FLOP/s of one device, for MFU; 0 uses a table of known CUDA GPUs
            (no MFU when unknown, e.g. on CPU).
    """

    kind: ClassVar[str] = "monitor"

    log_every_n_steps: int = 10
    progress: str = "auto"
    grad_norm: bool = True
    rank_spread_tolerance: float = 0.05
    loggers: list[Any] = field(default_factory=lambda: ["csv"])
    logger_args: dict[str, Any] = field(default_factory=dict)
    on_nonfinite: str = "stop"
    max_bad_steps: int = 20
    grad_spike_factor: float = 10.0
    loss_divergence_factor: float = 100.0
    stall_timeout_s: float = 0.0
    objective: str = "val/loss"
    objective_mode: str = "min"
    peak_flops: float = 0.0

    def metric_names(self, *, gpu: bool) -> tuple[str, ...]:
        """The training metrics this monitor logs (``metrics.csv`` columns besides the task's ``val/...``).

        *gpu*: the job trains on GPUs (MFU needs a known peak). The plan checks every metric a
        block names (``monitor.objective``, ``checkpoint.monitor``) against these and the task's.
        """
        return ("train/loss", "lr", "samples_per_s")


@register("default")
@dataclass(frozen=True, kw_only=True)
class Monitor(MonitorBlock):
    """Metrics, loggers and progress from global rank 0, and health policies on every rank.

    Metrics are accumulated on the device and read back only every ``log_every_n_steps``,
    so logging costs (almost) nothing between rows.

    Its fields are declared on :class:`MonitorBlock`.
    """

    def metric_names(self, *, gpu: bool) -> tuple[str, ...]:
        """Loss, LR and throughput, the gradient norm when ``grad_norm``, MFU with a peak to divide by."""
        names = list(super().metric_names(gpu=gpu))
        if self.grad_norm:
            names.append("grad_norm")
        if self.peak_flops or gpu:
            names.append("mfu")
        return tuple(names)

    def import_paths(self) -> list[tuple[str, str, Kind]]:
        """The Lightning logger classes of ``loggers`` (names with a dot, ``_target_`` of entries)."""
        paths = []
        for i, entry in enumerate(self.loggers):
            if isinstance(entry, Mapping):
                paths += entry_import_paths(
                    {**entry, TARGET_KEY: str(entry.get(TARGET_KEY))}, f"monitor.loggers[{i}]", LOGGER_CLASS
                )
            elif "." in str(entry):
                paths.append(("monitor.loggers", str(entry), LOGGER_CLASS))
        return paths

    def check(self, ctx: CheckContext) -> None:
        """Positive interval, known modes and policies, importable-looking logger names."""
        ctx.positive("log_every_n_steps", self.log_every_n_steps)
        ctx.choice("progress", self.progress, PROGRESS)
        ctx.positive("rank_spread_tolerance", self.rank_spread_tolerance)
        ctx.choice("on_nonfinite", self.on_nonfinite, NONFINITE_POLICIES)
        ctx.positive("max_bad_steps", self.max_bad_steps, allow_zero=True)
        ctx.positive("grad_spike_factor", self.grad_spike_factor, allow_zero=True)
        ctx.positive("loss_divergence_factor", self.loss_divergence_factor, allow_zero=True)
        if 0 < self.loss_divergence_factor <= 1:
            ctx.error(
                "loss_divergence_factor",
                f"{self.loss_divergence_factor:g} would call any loss above the first one divergence",
                "monitor.loss_divergence_factor=100 (or 0 to turn the check off)",
                check="divergence-factor",
            )
        ctx.positive("stall_timeout_s", self.stall_timeout_s, allow_zero=True)
        ctx.choice("objective_mode", self.objective_mode, OBJECTIVE_MODES)
        # A minimized objective falls back to train/loss; a maximized one has nothing to stand in.
        maximized = self.objective_mode == "max"
        ctx.monitored_metric(
            "objective",
            self.objective,
            check="objective-metric",
            validation_check="objective-validation",
            validation_severity="error" if maximized else "warning",
            fallback="it is maximized, and train/loss (what a sweeper gets instead) is a loss"
            if maximized
            else "a sweeper gets train/loss instead",
            validation_fix="give the data a validation split (e.g. data.val_fraction=0.1), or minimize the "
            "training loss: monitor.objective=train/loss monitor.objective_mode=min "
            "(and hydra.sweeper.direction=minimize)"
            if maximized
            else "",
        )
        ctx.positive("peak_flops", self.peak_flops, allow_zero=True)
        for i, entry in enumerate(self.loggers):
            if isinstance(entry, Mapping):
                self._check_entry(ctx, i, entry)
        lightning = [name for name in self.loggers if isinstance(name, str) and name not in BUILTIN_LOGGERS]
        for name in lightning:
            if "." not in name:
                ctx.error(
                    "loggers",
                    f"'{name}' is not a logger",
                    f"use {', '.join(BUILTIN_LOGGERS)} or the import path of a Lightning logger class, "
                    "e.g. pytorch_lightning.loggers.MLFlowLogger",
                    check="import-path",
                )
                continue
            problem = path_problem(name, "monitor.loggers", kind=LOGGER_CLASS)
            if problem is not None:
                ctx.error("loggers", problem.message, problem.fix, check=problem.check)
        for key, _ in targets_in(self.logger_args, "monitor.logger_args"):
            ctx.error(
                key.removeprefix("monitor."),
                "logger arguments are plain values; they build no objects",
                "remove the _target_ (name the logger class in monitor.loggers)",
                check="import-denied",
            )
        if len(lightning) > 1:
            ctx.error(
                "loggers",
                f"{len(lightning)} Lightning loggers are named by path; logger_args can configure only one",
                "give each its arguments: monitor.loggers=[{_target_: <class>, <argument>: <value>}, ...]",
                check="one-lightning-logger",
            )
        if self.on_nonfinite == "rollback" and not ctx.checkpoint.enabled:
            ctx.error(
                "on_nonfinite",
                "rollback needs committed checkpoints, but checkpoint.enabled is false",
                "set checkpoint.enabled=true, or monitor.on_nonfinite=skip",
                check="rollback-checkpoints",
            )

    @staticmethod
    def _check_entry(ctx: CheckContext, i: int, entry: Mapping[str, Any]) -> None:
        """A ``{_target_: ..., args}`` logger entry: an allowed logger class; nested ``_target_`` allowed too."""
        key = f"monitor.loggers[{i}]"
        target = entry.get(TARGET_KEY)
        if not isinstance(target, str):
            ctx.error(
                key,
                "a logger entry is {_target_: <import path of a Lightning logger class>, <argument>: <value>}",
                "monitor.loggers=[{_target_: pytorch_lightning.loggers.CSVLogger, save_dir: logs}]",
                check="import-path",
            )
            return
        report_import_paths(ctx, entry_import_paths(entry, key, LOGGER_CLASS))
