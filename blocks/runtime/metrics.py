"""The metrics callback: cheap accumulation on the device, one host sync per logging interval."""

from __future__ import annotations

import logging
import resource
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytorch_lightning as pl
import torch

from blocks.compat.torch_private import loss_scale_in_gradients
from blocks.monitor.sinks import MetricSink, Row
from blocks.runtime.health import HealthGuard, total_grad_norm
from blocks.runtime.module import VALIDATION_PREFIX
from blocks.runtime.ranks import every_rank, rank_and_world

log = logging.getLogger(__name__)
PER_RANK_COLUMNS_UP_TO = 8
SPREAD_WINDOWS_BEFORE_WARNING = 3
"""A spread must persist this many logged windows to warn: one noisy window is sampling, not a fault."""


class MetricsRecorder(pl.Callback):
    """Collects training metrics every ``log_every_n_steps`` optimizer steps and validation metrics.

    Between rows, the loss of each micro-batch is added to a device tensor (no host sync);
    at a logging step the row is read back once: ``train/loss`` (mean over the steps since
    the last row), ``lr`` (the rate the optimizer used for the logged step, read before the
    scheduler steps), ``grad_norm`` (before clipping, unscaled), ``samples_per_s``,
    ``tokens_per_s`` (token batches), ``step_time_s``, ``data_wait_s`` (time per step spent
    waiting for the next batch), ``peak_memory_mb`` (CUDA max allocated, or the process's peak
    RSS on CPU, since this job's training started: see :func:`reset_peak_memory`) and, when
    the model reports its FLOPs per sample, ``tflops_per_s`` and ``mfu``
    (when the device's peak at the run's precision is known: fp32 for ``32-true``, the 16-bit
    tensor-core peak otherwise). With several processes the loss is averaged over ranks and
    ``train/loss_spread`` ((max - min) / mean over ranks) is logged, with each rank's loss
    for up to 8 ranks; a spread over ``rank_spread_tolerance`` for 3 logged windows in a row
    is a warning (once per episode). Only global
    rank 0 writes to the sinks.

    A step skipped by ``monitor.on_nonfinite`` is left out of ``train/loss`` (its loss is kept
    apart until the :class:`HealthGuard`'s verdict, a device tensor on the fused path), but
    counts in throughput and timing: its batches were computed.
    """

    def __init__(
        self,
        sinks: list[MetricSink],
        *,
        every_n_steps: int,
        global_batch: int,
        grad_norm: bool,
        rank_spread_tolerance: float = 0.05,
        health: HealthGuard | None = None,
        tokens_per_sample: int | None = None,
        flops_per_sample: float | None = None,
        peak_flops: float = 0.0,
        precision: str = "32-true",
    ) -> None:
        self.sinks = sinks
        self.precision = precision
        self.health = health
        self.tokens_per_sample = tokens_per_sample
        self.flops_per_sample = flops_per_sample
        self.peak_flops = peak_flops
        self.every = every_n_steps
        self.global_batch = global_batch
        self.want_grad_norm = grad_norm
        self.rank_spread_tolerance = rank_spread_tolerance
        self._spread_windows = 0
        self.last: Row = {}
        self.measured_at: dict[str, int] = {}
        """The optimizer step each metric of :attr:`last` was logged at."""
        self._resumed_training: set[str] = set()  # the resumed checkpoint's, until a row replaces them
        self._loss_sum: torch.Tensor | None = None  # over the window's counted steps
        self._step_loss: torch.Tensor | None = None  # over the micro-batches of the step in progress
        self._carried_loss = 0.0  # the loss summed over the counted steps of the window a checkpoint saved
        self._carried_steps = 0
        self._steps = 0
        self._seen_step = 0
        self._window_start = 0.0
        self._train_start = 0.0
        self._train_end: float | None = None
        self._earlier_samples = 0  # trained by the attempts before this one, up to the checkpoint it resumed
        self._earlier_seconds = 0.0
        self._grad_norm: torch.Tensor | None = None
        self._lr: float | torch.Tensor | None = None
        self.samples_seen = 0
        """Samples of this attempt's logged windows."""
        self._batch_end = 0.0
        self._data_wait = 0.0
        self._windows = 0
        self._paused = 0.0
        self._validation_start: float | None = None
        self._stall_seen = 0.0
        self.stall_clock: Callable[[], float] = lambda: 0.0
        """Seconds training has waited for checkpoint saves so far (set by the builder)."""
        self.steady_samples = 0
        self.steady_seconds = 0.0
        self.training_started = False
        """Whether this session's training loop began (after the checkpoint it resumes was restored)."""

    def state_dict(self) -> dict[str, Any]:
        """Every rank's open logging window (the loss summed over its steps so far) and the run's throughput counts, saved with a checkpoint.

        A resume between logged steps then logs the same ``train/loss`` at the next one as a run
        that was never interrupted, and its throughputs go on from the samples and seconds of
        training up to the checkpoint. A collective: Lightning calls it on every rank when saving.
        """
        loss = self._carried_loss + (0.0 if self._loss_sum is None else float(self._loss_sum))
        skipped = self.health.skipped_in_open_window() if self.health is not None else 0
        steps = self._carried_steps + self._steps
        return {
            "window": every_rank({"loss_sum": loss, "steps": steps, "skipped": skipped}),
            "throughput": {
                "samples": self.samples_trained,
                "seconds": self.train_seconds,
                "steady_samples": self.steady_samples,
                "steady_seconds": self.steady_seconds,
            },
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Go on with the run's throughput counts, and reopen this rank's logging window as saved (on another world size, a new window starts)."""
        self._load_throughput(state_dict.get("throughput") or {})
        windows = state_dict.get("window") or []
        rank, world = rank_and_world()
        if len(windows) != world:
            return
        window = windows[rank]
        self._carried_loss = float(window.get("loss_sum") or 0.0)
        self._carried_steps = int(window.get("steps", 0)) - int(window.get("skipped", 0))

    def _load_throughput(self, saved: dict[str, Any]) -> None:
        """The samples and seconds of training before the checkpoint (a checkpoint saved before they were kept has none)."""
        self._earlier_samples = int(saved.get("samples", 0))
        self._earlier_seconds = float(saved.get("seconds", 0.0))
        self.steady_samples = int(saved.get("steady_samples", 0))
        self.steady_seconds = float(saved.get("steady_seconds", 0.0))

    def resume_from(self, metrics: Mapping[str, float], step: int) -> None:
        """Start from the metrics the resumed checkpoint's manifest holds, logged at its *step*.

        A rerun that trains nothing more (and does not validate that step again) then still
        reports them. Its validation metrics stand until a validation replaces them, as in a run
        never interrupted; its training metrics are dropped as a whole by this session's first
        logged training row (one the checkpoint's run logged and this one does not, e.g. another
        world size's per-rank losses, does not outlive it). Every rank reads the same manifest.
        """
        self.last.update(metrics)
        self.measured_at.update(dict.fromkeys(metrics, step))
        self._resumed_training = {name for name in metrics if not name.startswith(VALIDATION_PREFIX)}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start the clocks, and the peak memory count: ``peak_memory_mb`` is this job's, not an earlier one's in the process."""
        reset_peak_memory(trainer.strategy.root_device)
        self.training_started = True
        self._train_end = None
        self._seen_step = trainer.global_step
        self._train_start = self._window_start = self._batch_end = time.perf_counter()
        if self.flops_per_sample and not self.peak_flops:
            self.peak_flops = device_peak_flops(trainer.strategy.root_device, self.precision) or 0.0

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Count the time since the last micro-batch ended as waiting for data (host clock, no sync)."""
        self._data_wait += time.perf_counter() - self._batch_end

    def batch_end_marker(self) -> pl.Callback:
        """A callback to put last in the trainer's list, so ``data_wait_s`` counts only the wait for data.

        It marks the end of a micro-batch (or of a validation) after every other callback's work,
        checkpoint saves included.
        """
        return _BatchEndMarker(self)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        """Note the LR this step uses (the scheduler steps after it); measure the gradient norm on logged steps.

        The gradient norm is taken before clipping, only on steps that will be logged: every
        ``every_n_steps``-th and the last one (``max_steps``), which ends a partial window. It is
        the norm the optimizer applies: gradients a fused optimizer will unscale in its step
        (``precision=16-mixed``) are divided by the loss scale here, on the device.
        """
        lr = optimizer.param_groups[0]["lr"]
        # A tensor LR is copied: the scheduler fills it in place when it steps.
        self._lr = lr.detach().clone() if isinstance(lr, torch.Tensor) else lr
        if self.want_grad_norm and self._logs_step(trainer.global_step + 1, trainer.max_steps):
            norm = total_grad_norm(pl_module)
            scale = loss_scale_in_gradients(trainer, optimizer)
            self._grad_norm = norm if norm is None or scale is None else norm / scale

    def _logs_step(self, step: int, last_step: int) -> bool:
        """Whether optimizer *step* ends a logged row: a multiple of the interval, or the run's last step."""
        return step % self.every == 0 or step == last_step

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Add the micro-batch loss (already divided by the accumulation count) and log on interval."""
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            loss = loss.detach()
            self._step_loss = loss if self._step_loss is None else self._step_loss + loss
        step = trainer.global_step  # a chain of Lightning properties: read once
        if step == self._seen_step:
            return
        self._count_step_loss()
        self._steps += step - self._seen_step
        self._seen_step = step
        if step % self.every == 0:
            self._flush(trainer)

    def _count_step_loss(self) -> None:
        """Add the optimizer step's loss (its micro-batches') to the window unless the step was skipped.

        A skipped step does not count, even when its loss was finite and only its gradients were
        not; on the fused path the verdict is a device tensor, so the step stays free of host syncs.
        """
        loss, self._step_loss = self._step_loss, None
        skipped = self.health.step_verdict() if self.health is not None else False
        if loss is None:
            return
        if isinstance(skipped, torch.Tensor):
            loss = torch.where(skipped.bool(), 0.0, loss)
        elif skipped:
            return
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss

    def _flush(self, trainer: pl.Trainer) -> None:
        if not self._steps:
            return
        now = time.perf_counter()
        elapsed = max(now - self._window_start, 1e-9)
        row: Row = {}
        if self.health is not None:
            self.health.settle(trainer)  # the steps skipped on the device, read once per row
        counted = self._steps - (self.health.skipped_in_window if self.health else 0)
        loss_sum, counted = self._loss_sum, counted + self._carried_steps
        if self._carried_steps:
            loss_sum = torch.tensor(self._carried_loss) if loss_sum is None else loss_sum + self._carried_loss
        if loss_sum is not None and counted > 0:
            row.update(self._loss_row(trainer, loss_sum / counted))
        lr = self._lr if self._lr is not None else trainer.optimizers[0].param_groups[0]["lr"]
        row["lr"] = float(lr)
        if self._grad_norm is not None:
            row["grad_norm"] = float(self._grad_norm)
        samples_per_s = self._steps * self.global_batch / elapsed
        row["samples_per_s"] = samples_per_s
        if self.tokens_per_sample:
            row["tokens_per_s"] = samples_per_s * self.tokens_per_sample
        row["step_time_s"] = elapsed / self._steps
        row["data_wait_s"] = self._data_wait / self._steps
        row["peak_memory_mb"] = peak_memory_mb(trainer.strategy.root_device)
        if self.flops_per_sample:
            achieved = samples_per_s * self.flops_per_sample
            row["tflops_per_s"] = achieved / 1e12
            if self.peak_flops:
                row["mfu"] = achieved / (self.peak_flops * trainer.world_size)
        if self.health is not None:
            row.update(self.health.row())
        self.samples_seen += self._steps * self.global_batch
        self._count_steady(elapsed)
        for name in self._resumed_training - row.keys():
            self.last.pop(name, None)
            self.measured_at.pop(name, None)
        self._resumed_training = set()
        self._emit(trainer, row)
        self._loss_sum, self._grad_norm, self._steps, self._data_wait = None, None, 0, 0.0
        self._carried_loss, self._carried_steps = 0.0, 0
        self._window_start = now
        if self.health is not None:
            self.health.check_row(trainer, row)

    def _count_steady(self, elapsed: float) -> None:
        """Add the window to the steady state unless it is the first (warm-up); validation and save stalls excluded."""
        stalls = self.stall_clock()
        paused = self._paused + stalls - self._stall_seen
        self._stall_seen, self._paused = stalls, 0.0
        self._windows += 1
        if self._windows > 1:
            self.steady_samples += self._steps * self.global_batch
            self.steady_seconds += max(elapsed - paused, 1e-9)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start the validation clock: its time is no training throughput."""
        self._validation_start = time.perf_counter()

    def _loss_row(self, trainer: pl.Trainer, loss: torch.Tensor) -> Row:
        """The window's mean loss; across ranks its mean, spread and (for a few ranks) each value."""
        if trainer.world_size == 1:
            return {"train/loss": float(loss)}
        per_rank = _gather_scalar(loss.detach().float())
        mean = float(per_rank.mean())
        spread = float(per_rank.max() - per_rank.min()) / abs(mean) if mean else 0.0
        row: Row = {"train/loss": mean, "train/loss_spread": spread}
        if trainer.world_size <= PER_RANK_COLUMNS_UP_TO:
            row.update({f"train/loss_rank{rank}": float(value) for rank, value in enumerate(per_rank)})
        self._spread_windows = self._spread_windows + 1 if spread > self.rank_spread_tolerance else 0
        if self._spread_windows == SPREAD_WINDOWS_BEFORE_WARNING and trainer.is_global_zero:
            log.warning(
                "step %d: training loss has differed across ranks by more than %.1f%% of its mean for %d "
                "logged steps (now %.1f%%): %s",
                trainer.global_step,
                100 * self.rank_spread_tolerance,
                SPREAD_WINDOWS_BEFORE_WARNING,
                100 * spread,
                ", ".join(f"{v:.4g}" for v in per_rank.tolist()),
            )
        return row

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Record the validation metrics at the current step."""
        if self._validation_start is not None:
            self._paused += time.perf_counter() - self._validation_start
            self._validation_start = None
        if trainer.sanity_checking:
            return
        values = getattr(pl_module, "val_metrics", {})
        if values:
            self._emit(trainer, dict(values))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Log the last partial window and stop the training clock."""
        self._flush(trainer)
        self._train_end = time.perf_counter()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Stop the training clock: a failed or interrupted run's throughput is of its training up to here."""
        if self.training_started and self._train_end is None:
            self._train_end = time.perf_counter()

    def _emit(self, trainer: pl.Trainer, row: Row) -> None:
        step = trainer.global_step
        self.last.update(row)
        self.measured_at.update(dict.fromkeys(row, step))
        # Lightning callbacks (EarlyStopping, ...) read metrics by blocks' names, train/loss included.
        trainer.callback_metrics.update({name: torch.tensor(value) for name, value in row.items()})
        if trainer.is_global_zero:
            for sink in self.sinks:
                sink.write(trainer.global_step, row)

    def logged_at(self, step: int) -> Row:
        """The metrics logged at optimizer step *step*: what a checkpoint of that step is ranked by.

        A metric last logged at an earlier step (a validation metric between validations) is
        left out: its value does not describe the model of *step*.
        """
        return {name: value for name, value in self.last.items() if self.measured_at.get(name) == step}

    def flush(self, trainer: pl.Trainer) -> None:
        """Write out buffered rows (global rank 0), e.g. right before a checkpoint."""
        if trainer.is_global_zero:
            for sink in self.sinks:
                sink.flush()

    def write_out(self) -> None:
        """Write out every sink's buffered rows, each on its own (one that fails leaves the others to write).

        For a process about to end without closing them (a stalled run's watchdog, global rank 0).
        """
        for sink in self.sinks:
            try:
                sink.flush()
            except Exception:
                log.exception("could not write out the buffered rows of %s", type(sink).__name__)

    def close(self) -> None:
        """Flush every sink."""
        for sink in self.sinks:
            sink.close()

    @property
    def train_seconds(self) -> float:
        """Seconds of training over the whole run: the attempts before this one up to the checkpoint it resumed, then this one's so far."""
        if not self.training_started:
            return self._earlier_seconds
        end = self._train_end if self._train_end is not None else time.perf_counter()
        return self._earlier_seconds + end - self._train_start

    @property
    def samples_trained(self) -> int:
        """Samples trained over the whole run, as :attr:`train_seconds` counts (the open window's steps too)."""
        return self._earlier_samples + self.samples_seen + self._steps * self.global_batch

    @property
    def samples_per_s(self) -> float:
        """Average training throughput over the whole run: warm-up, validation and checkpoint stalls included.

        For a run that failed or was interrupted, up to the exception; for a resumed run, every
        attempt's training that its checkpoints kept (the steps an attempt took after its last
        checkpoint were taken again, and count once).
        """
        seconds = self.train_seconds
        return self.samples_trained / seconds if seconds else 0.0

    @property
    def tokens_per_s(self) -> float | None:
        """:attr:`samples_per_s` in tokens (token batches only)."""
        return self.samples_per_s * self.tokens_per_sample if self.tokens_per_sample else None

    @property
    def steady_samples_per_s(self) -> float | None:
        """Training throughput after the first logged window, without validation and checkpoint stalls.

        None until two windows were logged (the first one is warm-up).
        """
        return self.steady_samples / self.steady_seconds if self.steady_seconds else None

    @property
    def steady_tokens_per_s(self) -> float | None:
        """:attr:`steady_samples_per_s` in tokens (token batches only)."""
        steady = self.steady_samples_per_s
        return steady * self.tokens_per_sample if steady is not None and self.tokens_per_sample else None


class _BatchEndMarker(pl.Callback):
    """Sets the recorder's batch-end clock after every other callback (see ``batch_end_marker``)."""

    def __init__(self, recorder: MetricsRecorder) -> None:
        self.recorder = recorder

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """A micro-batch and everything after it is done."""
        self.recorder._batch_end = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Validation (and a save waiting for it) is done."""
        self.recorder._batch_end = time.perf_counter()


_PROC_STATUS = "/proc/self/status"
_PROC_CLEAR_REFS = "/proc/self/clear_refs"
_RESET_PEAK_RSS = "5"  # clear_refs(5): VmHWM starts again from the current resident set size


def reset_peak_memory(device: torch.device) -> None:
    """Start :func:`peak_memory_mb` again from the memory in use now, so it covers this job only.

    A process that runs jobs one after another (a sweep's or a pipeline's jobs in the
    ``blocks run`` process) would otherwise report each job's peak as the highest of all
    before it (those launch the job after collecting what the earlier ones left:
    :func:`blocks.launch.collector.collect_earlier_jobs`). On a GPU it resets CUDA's peak
    statistics of *device*; on a Linux CPU the process's peak resident set size (``VmHWM``).
    Elsewhere (macOS) there is nothing to reset: the peak stays the whole process's.
    """
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open(_PROC_CLEAR_REFS, "w") as fh:
            fh.write(_RESET_PEAK_RSS)
    except OSError:  # not Linux, or a kernel that refuses it: the peak stays the process's
        pass


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory in MiB since :func:`reset_peak_memory`: CUDA max allocated on a GPU, the peak RSS otherwise.

    On a CPU the peak resident set size is Linux's ``VmHWM``; where it cannot be read, the
    process's ``ru_maxrss`` (its whole lifetime, not reset).
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak_kib = _peak_rss_kib()
    if peak_kib is not None:
        return peak_kib / 2**10
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def _peak_rss_kib() -> int | None:
    """``VmHWM`` of ``/proc/self/status`` in KiB (None where there is none: not Linux)."""
    try:
        with open(_PROC_STATUS) as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


PEAK_TFLOPS_BF16 = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0}
"""Dense bf16 (and fp16) tensor-core peak TFLOP/s of common data-center GPUs, by a substring of the device name."""
PEAK_TFLOPS_FP32 = {"H200": 67.0, "H100": 67.0, "A100": 19.5, "L40S": 91.6, "A10G": 31.2, "L4": 30.3}
"""Dense fp32 peak TFLOP/s of the same GPUs (``precision=32-true`` computes in fp32)."""


def peak_flops_for(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s of the GPU named *device_name* at Lightning *precision* (``32-true``, ``bf16-mixed``, ...).

    16-bit precisions (``bf16-*``, ``16-*``) use the tensor-core peak, anything else the fp32 peak.
    """
    table = PEAK_TFLOPS_BF16 if precision.startswith(("bf16", "16")) else PEAK_TFLOPS_FP32
    for key, tflops in table.items():
        if key in device_name:
            return tflops * 1e12
    return None


def device_peak_flops(device: torch.device, precision: str = "bf16-mixed") -> float | None:
    """Peak FLOP/s of *device* at *precision* when it is a GPU in the tables, else None."""
    if device.type != "cuda":
        return None
    return peak_flops_for(torch.cuda.get_device_name(device), precision)


def _gather_scalar(value: torch.Tensor) -> torch.Tensor:
    """Every rank's value of a scalar tensor, in rank order (one all-gather)."""
    import torch.distributed as dist

    parts = [torch.zeros_like(value) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, value)
    return torch.stack(parts).cpu()
