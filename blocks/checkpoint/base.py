"""The checkpoint kind: where and when training state is saved, and what a run resumes from."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, cast

from blocks.spec.block import Block
from blocks.spec.registry import register

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext
    from blocks.strategy.base import StrategyBlock
    from blocks.trainer.base import TrainerBlock


@dataclass(frozen=True, kw_only=True)
class CheckpointBlock(Block):
    """Base of checkpoint blocks: the fields the plan, build and launch layers read.

    A checkpoint block of another package subclasses this base and gets the same treatment as the
    built-in: every layer reads only what is declared here.

    Attributes:
        dir: where checkpoints go (local path or fsspec URL such as ``s3://bucket/run``);
            null means ``checkpoints/`` in the run dir.
        every_n_steps: save every N optimizer steps; 0 turns the step trigger off.
        every_seconds: also save when this many seconds passed since the last save; null: off.
        keep_last: how many of the newest checkpoints to keep (at least 1).
        keep_best: also keep this many with the best ``monitor`` value.
        monitor: metric that ranks checkpoints for ``keep_best``, e.g. ``val/loss``.
        mode: ``min`` or ``max``: which ``monitor`` values are best.
        resume: ``auto`` continues from the newest committed checkpoint in ``dir`` if there is one,
            ``never`` starts fresh, a URL resumes from that checkpoint or fails.
        on_signal: save when SIGTERM or SIGINT stops training (preemption), then end ``interrupted``.
        enabled: false turns saving and resuming off.
        save_weights: write the final consolidated weights to ``model.safetensors`` in the run dir.
        async_save: training waits only for a copy of the state to host memory; writing, hashing
            and committing happen in the background, one save in flight at a time.
    """

    kind: ClassVar[str] = "checkpoint"

    dir: str | None = None
    every_n_steps: int = 0
    every_seconds: float | None = None
    keep_last: int = 2
    keep_best: int = 0
    monitor: str | None = None
    mode: str = "min"
    resume: str = "auto"
    on_signal: bool = True
    enabled: bool = True
    save_weights: bool = True
    async_save: bool = False

    def preflight(self, ctx: CheckContext) -> None:
        """Checks that read storage (e.g. the checkpoint to resume), run after the pure plan; report through *ctx*."""


@register("default")
@dataclass(frozen=True, kw_only=True)
class Checkpoint(CheckpointBlock):
    """Committed checkpoints of the full training state on any fsspec URL, retention and exact resume.

    A checkpoint counts only once its manifest (sizes and sha256 of its files) is written;
    resume skips corrupt or unfinished ones. Restored: model, optimizer, LR schedule, loop
    counters, every rank's RNG states and the position in the global batch stream.

    Its fields are declared on :class:`CheckpointBlock`.
    """

    def check(self, ctx: CheckContext) -> None:
        """Sane triggers and retention; the monitored metric must be one the task logs."""
        ctx.positive("every_n_steps", self.every_n_steps, allow_zero=True)
        ctx.positive("every_seconds", self.every_seconds)
        ctx.positive("keep_last", self.keep_last)
        ctx.positive("keep_best", self.keep_best, allow_zero=True)
        ctx.choice("mode", self.mode, ("min", "max"))
        if not self.resume:
            ctx.error(
                "resume",
                "must be 'auto', 'never' or a checkpoint URL",
                "checkpoint.resume=auto",
                check="choice",
            )
        total = ctx.derived.total_steps
        if self.enabled and self.every_n_steps and total and self.every_n_steps > total:
            ctx.warning(
                "every_n_steps",
                f"a checkpoint every {self.every_n_steps} steps never comes before the end of training "
                f"({total} steps); only the final one is saved",
                f"checkpoint.every_n_steps={max(1, total // 4)}",
                check="checkpoint-every-within-training",
                related=("trainer.max_steps", "trainer.max_epochs"),
            )
        if self.keep_best and not self.monitor:
            ctx.error(
                "monitor",
                "checkpoint.keep_best needs a metric to rank by",
                "checkpoint.monitor=val/loss",
                check="keep-best-monitor",
                related=("checkpoint.keep_best",),
            )
        if self.monitor:
            ctx.monitored_metric(
                "monitor",
                self.monitor,
                check="checkpoint-monitor-metric",
                validation_check="checkpoint-monitor-validation",
            )
        self._check_best_candidates(ctx)

    def _check_best_candidates(self, ctx: CheckContext) -> None:
        """``keep_best`` by a ``val/`` metric ranks only checkpoints saved at a validation step: warn when none is."""
        if not (self.enabled and self.keep_best and self.monitor and self.monitor.startswith("val/")):
            return
        trainer = cast("TrainerBlock", ctx.block("trainer"))
        total, val_every = ctx.derived.total_steps, trainer.val_every or ctx.derived.steps_per_epoch
        if self.every_seconds or not (total and val_every and ctx.derived.val_samples):
            return  # timed saves fall anywhere; without validation the metric check reports it
        every = self.every_n_steps
        if total % val_every == 0 or (every and math.lcm(every, val_every) <= total):
            return
        ctx.warning(
            "keep_best",
            f"no checkpoint is saved at a validation step (a checkpoint every {every or total} steps, "
            f"validation every {val_every}, {total} steps in all), so keep_best never has one to "
            f"rank by {self.monitor}; only keep_last keeps checkpoints",
            f"checkpoint.every_n_steps={val_every} (or a multiple of trainer.val_every)",
            check="keep-best-candidates",
            related=("trainer.val_every",),
        )

    def preflight(self, ctx: CheckContext) -> None:
        """I/O the pure plan leaves out: an explicit resume URL must name a committed checkpoint in the strategy's format.

        Its files are verified at run time; this reads only the manifest.
        """
        if not self.enabled or not self.resume or self.resume in ("auto", "never"):
            return
        from blocks.checkpoint import store

        try:
            manifest = store.read_manifest(self.resume)
        except Exception as exc:
            ctx.error(
                "resume",
                str(exc) if isinstance(exc, store.CheckpointError) else f"cannot read {self.resume}: {exc}",
                "point checkpoint.resume at a committed checkpoint directory (one with MANIFEST.json), "
                "or use checkpoint.resume=auto",
                check="resume-committed",
            )
            return
        strategy = cast("StrategyBlock", ctx.block("strategy"))
        sharded = strategy.memory_layout().shards_parameters
        if manifest.sharded != sharded:
            saved, now = ("sharded (FSDP)", "full") if manifest.sharded else ("full", "sharded (FSDP)")
            ctx.error(
                "resume",
                f"{self.resume} is a {saved} checkpoint, but strategy={strategy.block_name} loads {now} ones",
                "resume with the strategy that saved it, or export its weights (blocks.checkpoint.export) "
                "and start a new run from them",
                check="checkpoint-format",
                related=("strategy",),
            )
