"""Turning a plan into Lightning objects: the module, the data module and the trainer."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytorch_lightning as pl

from blocks.checkpoint import store
from blocks.checkpoint.io import FsspecCheckpointIO
from blocks.checkpoint.resume import checkpoint_dir, job_digests, read_start, resolve_resume
from blocks.compat.torch_private import (
    drop_inherited_step_hooks,
    read_step_signature_once,
    skip_automatic_hyperparameters,
)
from blocks.core.environment import restart_count
from blocks.core.plan import Plan
from blocks.core.provenance import SOURCES_KEY, block_sources
from blocks.core.run_files import CHECKPOINTS_DIR, CONFIG_FILE, METRICS_FILE, Summary
from blocks.data.base import TokenBatch
from blocks.monitor.sinks import ConsoleSink, CsvSink, MetricSink, row_at
from blocks.runtime.callbacks import build_callbacks
from blocks.runtime.checkpointing import CheckpointCallback
from blocks.runtime.cluster import cluster_environment
from blocks.runtime.datamodule import BlocksDataModule
from blocks.runtime.health import HealthGuard, StallWatchdog
from blocks.runtime.loggers import LoggerSink, build_loggers, hyperparameters
from blocks.runtime.metrics import MetricsRecorder
from blocks.runtime.module import VALIDATION_PREFIX, BlocksModule
from blocks.runtime.preemption import Preemption
from blocks.runtime.seeds import RankStreams

if TYPE_CHECKING:
    from omegaconf import DictConfig

_QUIET_LOGGERS = ("pytorch_lightning.utilities.rank_zero", "pytorch_lightning.accelerators.cuda")


@dataclass
class BuiltRun:
    """The Lightning objects of one run, and the checkpoint it resumes from."""

    module: BlocksModule
    datamodule: BlocksDataModule
    trainer: pl.Trainer
    recorder: MetricsRecorder
    resume_from: str | None = None
    checkpointer: CheckpointCallback | None = None
    health: HealthGuard | None = None
    preemption: Preemption | None = None
    users: list[pl.Callback] = field(default_factory=list)
    """The callbacks of ``trainer.callbacks``, in its order."""
    loggers: list[LoggerSink] = field(default_factory=list)
    """The loggers of ``monitor.loggers``: :func:`~blocks.runtime.loggers.finalize_loggers` ends their runs."""


def quiet_lightning() -> None:
    """Silence Lightning's start-up chatter; the plan already says what runs where."""
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")


def build_run(
    plan: Plan,
    run_dir: Path,
    *,
    console: bool = True,
    run_config: DictConfig | None = None,
    own_process: bool = False,
    checks: Sequence[pl.Callback] = (),
) -> BuiltRun:
    """Build the module, data module and trainer for *plan*, writing metrics into *run_dir*.

    *run_config* is the run dir's ``config.yaml`` when the caller has read it already (a
    worker has, to rebuild the plan); otherwise it is read again for the loggers.
    *own_process*: the process runs this job only (a worker torchrun, srun, mpirun or Ray
    started), so a stall ends it at once (:class:`StallWatchdog`); otherwise the process goes on
    after the job (a sweep's next job) and a stall first interrupts training. *checks* are
    callbacks that run before blocks' own (their ``setup`` refuses a run before it trains).
    """
    environment = cluster_environment(plan)  # refuses a worker no launcher started, before writing anything
    claim_rank(environment)
    quiet_lightning()
    derived = plan.derived
    trainer_block = plan.trainer
    monitor = plan.monitor
    pl.seed_everything(trainer_block.seed, workers=True, verbose=False)
    spec = plan.data.batch_spec()
    checkpoint_block = plan.checkpoint
    directory = checkpoint_dir(plan, default=str(run_dir / CHECKPOINTS_DIR))
    start = read_start(run_dir)
    resume_from = resolve_resume(plan, directory, start)
    resumed = store.read_manifest(resume_from) if resume_from else None
    resumed_step = resumed.step if resumed else None
    parallelize = plan.strategy.parallelizer(precision=plan.precision, units=plan.model.shard_units())
    optim = plan.optim.replace(lr=derived.effective_lr)  # optim.lr_scaling applied once, in the plan
    if getattr(optim, "fused", False) is None and _amp_clips(plan):
        optim = optim.replace(fused=False)  # Lightning's mixed-precision plugin cannot clip a fused optimizer
    compile_mode = plan.strategy.compile_mode if plan.strategy.compile else None
    module = BlocksModule(
        plan.model, plan.task, optim, spec, derived.total_steps, parallelize, compile_mode, data=plan.data
    )
    # Right after the model's draws: data-parallel index 0 trains on from here.
    streams = RankStreams(trainer_block.seed, derived.mesh.data_parallel_rank)
    datamodule = BlocksDataModule(
        plan.data,
        derived=derived,
        seed=trainer_block.seed,
        overfit_batches=trainer_block.overfit_batches,
    )
    loggers = build_loggers(
        monitor,
        run_dir,
        resumed_step=resumed_step,
        hyperparameters=run_hyperparameters(plan, run_dir, run_config),
        resumed_row=_logged_at(resumed, run_dir, derived.total_steps) if resumed else None,
    )
    if resumed and any(name.startswith(VALIDATION_PREFIX) for name in resumed.metrics):
        # A rerun that trains nothing does not validate that step again (nor log it twice).
        module.validated_at_step = resumed.step
    sinks = metric_sinks(run_dir, resumed_step, loggers)
    if console and monitor.progress != "off":
        sinks.append(ConsoleSink(derived.total_steps, monitor.progress, start_step=resumed_step or 0))
    health = HealthGuard(
        monitor.on_nonfinite,
        max_bad_steps=monitor.max_bad_steps,
        spike_factor=monitor.grad_spike_factor,
        checkpoint_dir=directory if checkpoint_block.enabled else None,
        candidates=start.candidates(),
        grad_scaler=plan.precision.needs_grad_scaler,
        divergence_factor=monitor.loss_divergence_factor,
    )
    recorder = MetricsRecorder(
        sinks,
        every_n_steps=monitor.log_every_n_steps,
        global_batch=derived.global_batch,
        grad_norm=monitor.grad_norm,
        rank_spread_tolerance=monitor.rank_spread_tolerance,
        health=health,
        tokens_per_sample=spec.seq_len if isinstance(spec, TokenBatch) else None,
        flops_per_sample=plan.model.flops_per_sample(spec),
        peak_flops=monitor.peak_flops,
        precision=plan.precision.lightning,  # the compute precision, FSDP too
    )
    if resumed:
        recorder.resume_from(resumed.metrics, resumed.step)
    callbacks: list[pl.Callback] = [
        *checks,
        streams,
        recorder,
        health,
        *plan.strategy.callbacks(accumulate=derived.accumulate),
    ]
    if monitor.stall_timeout_s:
        callbacks.append(
            StallWatchdog(
                monitor.stall_timeout_s,
                run_dir,
                on_stall=_stall_summary(run_dir, plan, recorder),
                exits_process=own_process,
            )
        )
    io = FsspecCheckpointIO(async_save=checkpoint_block.enabled and checkpoint_block.async_save)
    io.beside[store.PACKAGES_FILE] = json.dumps({SOURCES_KEY: block_sources(plan.blocks)}, indent=2)
    checkpointer = None
    if checkpoint_block.enabled:
        checkpointer = CheckpointCallback(
            checkpoint_block,
            io,
            directory=directory,
            accumulate=derived.accumulate,
            global_batch=derived.global_batch,
            world_size=derived.world_size,
            block_digests=job_digests(plan),
            resumed_from=resume_from,
            job=start.job,
            steps_per_epoch=derived.steps_per_epoch,
            metrics=recorder.logged_at,
            before_save=recorder.flush,
            fresh_streams=streams.start_fresh,
        )
        callbacks.append(checkpointer)
        recorder.stall_clock = lambda: checkpointer.stall_s
    users = build_callbacks(list(trainer_block.callbacks))
    callbacks += users  # after blocks' own: they see this step's metrics
    preemption = Preemption(derived.accumulate, monitor.log_every_n_steps, plan.trainer.shutdown_grace_s)
    callbacks.append(preemption)
    callbacks.append(
        recorder.batch_end_marker()
    )  # last: after saves, so data_wait_s is only the wait for data
    own_hooks: list[pl.Callback | pl.LightningModule] = [module, *(c for c in callbacks if c not in users)]
    for own in own_hooks:
        drop_inherited_step_hooks(own)  # no per-step dispatch of the hooks blocks does not use
    val_every = trainer_block.val_every
    has_val = derived.val_samples > 0
    trainer = pl.Trainer(
        accelerator=derived.accelerator,
        devices=derived.devices,
        num_nodes=derived.nodes,
        strategy=plan.strategy.build(
            accelerator=derived.accelerator, precision=plan.precision, world_size=derived.world_size, io=io
        ),
        precision=plan.strategy.lightning_precision(plan.precision),  # type: ignore[arg-type]
        plugins=[environment],
        max_steps=derived.total_steps,
        max_epochs=-1,
        accumulate_grad_batches=derived.accumulate,
        gradient_clip_val=plan.optim.grad_clip,
        gradient_clip_algorithm=trainer_block.gradient_clip_algorithm if plan.optim.grad_clip else None,
        val_check_interval=val_every * derived.accumulate if (val_every and has_val) else None,
        check_val_every_n_epoch=None if val_every else 1,
        limit_train_batches=_micro_batches(trainer_block.limit_train_batches, derived.accumulate),
        limit_val_batches=trainer_block.limit_val_batches if has_val else 0,
        profiler=_profiler(trainer_block.profiler, run_dir),
        detect_anomaly=trainer_block.detect_anomaly,
        num_sanity_val_steps=0,
        logger=[sink.logger for sink in loggers] or False,
        log_every_n_steps=monitor.log_every_n_steps,  # a LearningRateMonitor or a callback's self.log: blocks' cadence
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        deterministic=trainer_block.deterministic,
        default_root_dir=str(run_dir),
        callbacks=callbacks,
    )
    skip_automatic_hyperparameters(module, datamodule)  # the loggers got the whole config above
    read_step_signature_once(trainer, module)
    preemption.install(trainer)
    return BuiltRun(
        module, datamodule, trainer, recorder, resume_from, checkpointer, health, preemption, users, loggers
    )


def claim_rank(environment: Any) -> None:
    """Give Lightning's ``rank_zero_only`` this process's global rank, as its launcher says, before anything logs.

    Lightning reads it at import from ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID`` or
    ``JSM_NAMESPACE_RANK`` only, and sets it again when the Trainer is built: until then a worker
    mpirun started (or one forked from a process that imported Lightning) took itself for rank 0
    and started its own logger runs.
    """
    from lightning_fabric.utilities.rank_zero import rank_zero_only

    rank_zero_only.rank = environment.global_rank()  # type: ignore[attr-defined]


def _logged_at(resumed: store.Manifest, run_dir: Path, total_steps: int) -> dict[str, float]:
    """What blocks logged at the checkpoint's step, for the loggers that drop it on resume to get back.

    The checkpoint's metrics; and when the run trains on past that step, what ``metrics.csv``
    holds of it beyond them: the final checkpoint of an older blocks was saved before the
    validation its run ended with (at a step ``trainer.val_every`` does not divide), which an
    extension does not repeat. A final checkpoint records that validation now, and a rerun with
    nothing left to train finds it there and validates nothing (one of an older checkpoint
    validates that step again and logs it then).
    """
    if resumed.step >= total_steps:
        return dict(resumed.metrics)
    return {**row_at(run_dir / METRICS_FILE, resumed.step), **resumed.metrics}


def _amp_clips(plan: Plan) -> bool:
    """Whether Lightning's mixed-precision plugin will clip the gradients (it refuses to for fused optimizers)."""
    precision = plan.strategy.lightning_precision(plan.precision)
    return str(precision).endswith("-mixed") and plan.optim.grad_clip is not None


def _micro_batches(steps: int | None, accumulate: int) -> int | None:
    """``trainer.limit_train_batches`` (optimizer steps per epoch) as Lightning's count of micro-batches."""
    return None if steps is None else steps * accumulate


class NoProfiler(pl.profilers.PassThroughProfiler):
    """Lightning's default profiler, which profiles nothing, without a context manager made per hook call.

    Lightning wraps every hook it dispatches in ``trainer.profiler.profile(name)``; the base
    class builds a generator-based context manager for each, about 40 a training step, to call
    the pass-through ``start`` and ``stop``. This one hands out one shared no-op context.
    """

    def profile(self, action_name: str) -> contextlib.nullcontext[None]:  # type: ignore[override]
        """A context that does nothing (the same one every time)."""
        return _NOTHING


_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()


def _profiler(name: str, run_dir: Path) -> pl.profilers.Profiler:
    """Lightning's profiler *name*, writing its report into ``<run dir>/profiler``; :class:`NoProfiler` for none."""
    if not name:
        return NoProfiler()
    classes = {
        "simple": pl.profilers.SimpleProfiler,
        "advanced": pl.profilers.AdvancedProfiler,
        "pytorch": pl.profilers.PyTorchProfiler,
    }
    return classes[name](dirpath=str(run_dir / "profiler"), filename="report")


def metric_sinks(run_dir: Path, resumed_step: int | None, loggers: list[LoggerSink]) -> list[MetricSink]:
    """``metrics.csv`` (always; see :mod:`blocks.runtime.loggers` for why it is no Lightning logger), then the loggers."""
    return [CsvSink(run_dir / "metrics.csv", keep_until_step=resumed_step), *loggers]


def run_hyperparameters(plan: Plan, run_dir: Path, run_config: DictConfig | None = None) -> dict[str, Any]:
    """What every logger gets as hyperparameters: the frozen ``config.yaml`` flattened, and the derived numbers.

    ``config.yaml`` is resolved already except ``${oc.env:...}`` values, which stay interpolations
    here too: a secret in the environment never reaches a logger's server. *run_config* is that
    file when the caller has read it. A run dir without ``config.yaml`` (a plan built
    in-process) logs its blocks' fields instead.
    """
    from omegaconf import OmegaConf

    path = run_dir / CONFIG_FILE
    if run_config is not None or path.exists():
        config = OmegaConf.to_container(
            OmegaConf.load(path) if run_config is None else run_config, resolve=False
        )
    else:
        config = {
            kind: {"_block_": block.block_name, **dataclasses.asdict(block)}
            for kind, block in plan.blocks.items()
        }
    flat = {str(k): v for k, v in config.items()} if isinstance(config, dict) else {}
    return hyperparameters(flat, dataclasses.asdict(plan.derived))


def _stall_summary(run_dir: Path, plan: Plan, recorder: MetricsRecorder) -> Callable[[str, int], None]:
    """What the stall watchdog of global rank 0 does before the process exits.

    It writes out the rows the metric sinks still buffer (``metrics.csv`` holds the last one
    until the next arrives) and a failed ``summary.json`` with the figures of training so far,
    as a run that failed with an exception has.
    """

    def write(reason: str, step: int) -> None:
        recorder.write_out()
        summary = Summary(
            status="failed",
            reason=reason,
            world_size=plan.derived.world_size,
            restarts=restart_count(),
        )
        record_progress(summary, plan, step, recorder)
        summary.write(run_dir)

    return write


def record_progress(summary: Summary, plan: Plan, step: int, recorder: MetricsRecorder) -> None:
    """Give *summary* the figures of training up to optimizer *step*: epoch, last logged metrics, throughput, save stall."""
    summary.global_step = step
    steps_per_epoch = plan.derived.steps_per_epoch
    summary.epoch = step // steps_per_epoch if steps_per_epoch else 0
    summary.metrics = dict(recorder.last)
    summary.samples_per_s = recorder.samples_per_s
    summary.tokens_per_s = recorder.tokens_per_s
    summary.train_s = recorder.train_seconds
    summary.steady_samples_per_s = recorder.steady_samples_per_s
    summary.steady_tokens_per_s = recorder.steady_tokens_per_s
    summary.checkpoint_stall_s = recorder.stall_clock()
