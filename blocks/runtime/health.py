"""Health of a training run: non-finite steps (stop, skip, rollback), gradient spikes, and a stall watchdog."""

from __future__ import annotations

import faulthandler
import logging
import math
import os
import signal
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from blocks.checkpoint import store
from blocks.compat.torch_private import dispatch_hook, set_found_inf, tensor_norms_in_float32
from blocks.core.environment import restart_count
from blocks.monitor.sinks import Row
from blocks.runtime.module import BlocksModule

log = logging.getLogger(__name__)

STACKS_DIR = "stacks"
STALL_EXIT_CODE = 3
STALL_GRACE_S = 10.0
"""Seconds the watchdog gives the other ranks' stack dumps, and a run it interrupted to come back and then end."""
STALL_ENV = "BLOCKS_FAULT_STALL"
"""Fault-injection hook for tests: ``RANK:STEP:SECONDS`` makes global rank RANK sleep SECONDS after optimizer
step STEP, in the first attempt only (a restarted job runs clean, as after a transient hang)."""
SPIKE_WINDOW = 20
SPIKE_MIN_HISTORY = 5


class NonFiniteError(RuntimeError):
    """Training produced a non-finite loss or gradient and the policy says to stop."""


class DivergenceError(NonFiniteError):
    """The training loss is finite but exploded past ``monitor.loss_divergence_factor`` and the policy says to stop."""


def total_grad_norm(module: torch.nn.Module) -> torch.Tensor | None:
    """The global L2 norm of every gradient, on the device, in float32 at least whatever the gradients' dtype.

    A full tensor also when FSDP shards the gradients. Low-precision gradients
    (``precision=bf16-true``) give the same norm whatever the process layout.
    """
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return None
    norms = tensor_norms_in_float32(grads)
    first = norms[0].device
    norm = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]))
    full_tensor = getattr(norm, "full_tensor", None)  # a DTensor when FSDP shards the grads
    return full_tensor() if full_tensor is not None else norm


class HealthGuard(pl.Callback):
    """Applies ``monitor.on_nonfinite`` and watches the gradient norm for spikes.

    ``skip`` and ``rollback`` check the gradient norm before every optimizer step (the
    gradients are already reduced across ranks, so every rank decides the same). A bad step's
    gradients are dropped, so the optimizer leaves the weights alone; ``rollback`` also
    restores the weights and optimizer state of the last committed checkpoint, and training
    goes on with the next batches. That check is one host sync per step, except for ``skip``
    with an optimizer that skips a step on the device (:func:`skips_on_device`: torch's fused
    Adam/AdamW): there the verdict stays a device tensor handed to the optimizer as
    ``found_inf`` (as the gradient scaler does), the skipped steps are counted on the device,
    and both are read at the logging interval (:meth:`settle`), where ``monitor.max_bad_steps``
    is enforced too. ``stop`` is checked on the rows the metrics callback reads back anyway
    (:meth:`check_row`), so it costs nothing.

    With a gradient scaler (``precision=16-mixed``) overflowing gradients are normal: the
    scaler skips those steps and lowers its scale. The policies then leave the gradients to
    the scaler and look at the loss only (``stop``, at logged steps).

    Its counters, the run of bad steps in progress, the divergence baseline and the recent
    gradient norms are saved with each checkpoint (:meth:`state_dict`), so a resumed run counts
    and judges as the run would have without the interruption. A rollback restores the weights
    and optimizer state only: the counters go on (``health/rollbacks`` only grows).
    """

    def __init__(
        self,
        policy: str,
        *,
        max_bad_steps: int,
        spike_factor: float,
        checkpoint_dir: str | None,
        candidates: store.Candidates | None = None,
        grad_scaler: bool = False,
        divergence_factor: float = 0.0,
    ) -> None:
        self.policy = policy
        self.candidates = candidates
        self.divergence_factor = divergence_factor
        self.divergences = 0
        self._first_loss: float | None = None
        self._first_loss_on_device: torch.Tensor | None = None  # NaN until a counted step's loss fills it
        self._step_first_loss: torch.Tensor | None = None  # of the optimizer step in progress
        self._seen_step = 0
        self.grad_scaler = grad_scaler
        self.max_bad_steps = max_bad_steps
        self.spike_factor = spike_factor
        self.checkpoint_dir = checkpoint_dir
        self.skipped_steps = 0
        self.rollbacks = 0
        self.grad_spikes = 0
        self.skipped_in_window = 0
        self._bad_in_a_row = 0
        self._norms: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self._warned_no_checkpoint = False
        self._on_device: _DeviceSkips | None = None
        self._step_skipped: torch.Tensor | bool = False
        # the longest run of bad steps a resumed checkpoint saved before max_bad_steps judged it
        self._unchecked_longest_run = 0

    def state_dict(self) -> dict[str, Any]:
        """The run's health so far, saved with a checkpoint (Lightning calls this on every rank).

        Every rank holds the same values: the gradients are reduced and the loss averaged over
        ranks before anything is judged. Steps skipped on the device since the last logged
        row are read here (one host read per save), so the counts include them.
        """
        skipped, run, longest = (
            self._on_device.snapshot() if self._on_device is not None else (0, self._bad_in_a_row, 0)
        )
        return {
            "skipped_steps": self.skipped_steps + skipped,
            "rollbacks": self.rollbacks,
            "grad_spikes": self.grad_spikes,
            "divergences": self.divergences,
            "bad_steps_in_a_row": run,
            "unchecked_longest_run": max(longest, self._unchecked_longest_run),
            "first_loss": self._divergence_baseline(),
            "grad_norms": list(self._norms),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Go on from a checkpoint's health; a checkpoint saved before it was recorded starts from zero."""
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
        self.rollbacks = int(state_dict.get("rollbacks", 0))
        self.grad_spikes = int(state_dict.get("grad_spikes", 0))
        self.divergences = int(state_dict.get("divergences", 0))
        self._bad_in_a_row = int(state_dict.get("bad_steps_in_a_row", 0))
        self._unchecked_longest_run = int(state_dict.get("unchecked_longest_run", 0))
        first_loss = state_dict.get("first_loss")
        # a non-finite one (saved before skipped steps were kept out of it) judges nothing: take a new one
        self._first_loss = None if first_loss is None or not math.isfinite(first_loss) else float(first_loss)
        self._first_loss_on_device = None
        self._norms.clear()
        self._norms.extend(float(norm) for norm in state_dict.get("grad_norms", []))

    @property
    def checks_every_step(self) -> bool:
        """Whether each step is checked before the optimizer applies it."""
        return self.policy in ("skip", "rollback") and not self.grad_scaler

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Have Lightning call the per-step hooks only while they have work to do in this run.

        After a resume's checkpoint is loaded: ``on_before_optimizer_step`` when each step is
        checked, ``on_train_batch_end`` until the divergence baseline is recorded.
        """
        self._seen_step = trainer.global_step
        self._step_first_loss = None
        dispatch_hook(self, "on_before_optimizer_step", self.checks_every_step)
        dispatch_hook(self, "on_train_batch_end", self._wants_first_loss())

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        """Drop a non-finite step's gradients (and roll back) before the optimizer sees them."""
        if not self.checks_every_step:
            return
        self._step_skipped = False
        if self.policy == "skip" and skips_on_device(optimizer):
            self._skip_on_device(pl_module, optimizer)
            return
        norm = total_grad_norm(pl_module)
        if norm is None or bool(torch.isfinite(norm)):
            self._bad_in_a_row = 0
            return
        self._step_skipped = True
        step = trainer.global_step + 1
        self._bad_in_a_row += 1
        if self.max_bad_steps and self._bad_in_a_row > self.max_bad_steps:
            raise NonFiniteError(
                f"non-finite gradients in {self._bad_in_a_row} optimizer steps in a row (up to step {step}); "
                f"monitor.on_nonfinite={self.policy} gave up after monitor.max_bad_steps={self.max_bad_steps}"
            )
        optimizer.zero_grad(set_to_none=True)
        self.skipped_steps += 1
        self.skipped_in_window += 1
        if self.policy == "rollback" and self._rollback(trainer):
            self.rollbacks += 1
            if trainer.is_global_zero:
                log.warning(
                    "step %d: non-finite gradients; rolled back to the last committed checkpoint", step
                )
        elif trainer.is_global_zero:
            log.warning("step %d: non-finite gradients; the step was skipped", step)

    def _skip_on_device(self, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer) -> None:
        """Hand the optimizer a device-side ``found_inf`` (1.0 when the gradient norm is not finite) and count."""
        norm = total_grad_norm(pl_module)
        if norm is None:
            set_found_inf(optimizer, None)
            return
        bad = torch.logical_not(torch.isfinite(norm)).to(torch.float32)
        set_found_inf(optimizer, bad)
        self._step_skipped = bad
        if self._on_device is None:
            self._on_device = _DeviceSkips(bad.device, run=self._bad_in_a_row)
        self._on_device.add(bad)

    def step_verdict(self) -> torch.Tensor | bool:
        """Whether the last optimizer step was skipped (asked once it ended: by the metrics callback, and here).

        A device tensor (1.0: skipped) when the fused optimizer skipped on the device, so asking
        costs no host sync; a bool when the host decided; False when steps are not checked.
        Each checked step starts with a fresh verdict (:meth:`on_before_optimizer_step`).
        """
        return self._step_skipped

    def skipped_in_open_window(self) -> int:
        """Steps skipped since the last logged row, those counted on the device included (read, not settled)."""
        return self.skipped_in_window + (self._on_device.peek() if self._on_device is not None else 0)

    def settle(self, trainer: pl.Trainer) -> None:
        """Read the steps skipped on the device since the last call (one host read, at a logged step).

        Raises :class:`NonFiniteError` when more than ``max_bad_steps`` of them came in a row
        (a run a resumed checkpoint saved unjudged included).
        """
        skipped, longest_run = self._on_device.read() if self._on_device is not None else (0, 0)
        longest_run = max(longest_run, self._unchecked_longest_run)
        self._unchecked_longest_run = 0
        if self.max_bad_steps and longest_run > self.max_bad_steps:
            raise NonFiniteError(
                f"non-finite gradients in {longest_run} optimizer steps in a row (up to step "
                f"{trainer.global_step}); monitor.on_nonfinite={self.policy} gave up after "
                f"monitor.max_bad_steps={self.max_bad_steps}"
            )
        if not skipped:
            return
        self.skipped_steps += skipped
        self.skipped_in_window += skipped
        if trainer.is_global_zero:
            log.warning(
                "non-finite gradients in %d optimizer step(s) up to step %d; those steps were skipped",
                skipped,
                trainer.global_step,
            )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Record the divergence baseline: the loss (mean over ranks) of the first counted optimizer step.

        A step's loss is its first micro-batch's, times the accumulation count. A step whose loss
        is not finite, or that ``skip`` or ``rollback`` dropped, does not count: the next one is
        offered. The baseline stays on the device until a logged row reads it (no sync in the
        step), and steps are offered until then. Under ``stop`` a non-finite first loss fails
        the run at its first logged row, so the first step's loss is recorded at once. A resumed
        run keeps the baseline its checkpoint saved.
        """
        if not self._wants_first_loss():
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None and self._step_first_loss is None:
            self._step_first_loss = trainer.strategy.reduce(
                loss.detach().float() * trainer.accumulate_grad_batches, reduce_op="mean"
            ).detach()
        if self.policy == "stop":
            if self._step_first_loss is not None:
                self._first_loss_on_device = self._step_first_loss
                dispatch_hook(self, "on_train_batch_end", False)
            return
        step = trainer.global_step
        if step == self._seen_step:  # the optimizer step goes on (gradient accumulation)
            return
        self._seen_step = step
        candidate, self._step_first_loss = self._step_first_loss, None
        skipped = self.step_verdict()
        if candidate is None or skipped is True:
            return
        counted = torch.isfinite(candidate)
        if isinstance(skipped, torch.Tensor):
            counted = torch.logical_and(counted, torch.logical_not(skipped.bool()))
        if self._first_loss_on_device is None:
            self._first_loss_on_device = torch.full_like(candidate, math.nan)
        unset = torch.isnan(self._first_loss_on_device)
        self._first_loss_on_device = torch.where(
            torch.logical_and(unset, counted), candidate, self._first_loss_on_device
        )

    def _wants_first_loss(self) -> bool:
        """Whether the divergence check still waits for its baseline."""
        return bool(self.divergence_factor) and self._first_loss is None

    def _rollback(self, trainer: pl.Trainer) -> bool:
        """Restore the weights and optimizer state of the newest valid checkpoint; False when there is none.

        Corrupt checkpoints are skipped with the same fallback as resume (:func:`store.newest_valid`),
        and so are those neither this job saved nor it continues (*candidates*, see
        :class:`blocks.checkpoint.resume.Start`).
        """
        newest = store.newest_valid(self.checkpoint_dir, self.candidates) if self.checkpoint_dir else None
        if newest is None:
            if not self._warned_no_checkpoint and trainer.is_global_zero:
                log.warning("no valid committed checkpoint to roll back to yet: skipping the step instead")
            self._warned_no_checkpoint = True
            return False
        checkpoint = trainer.strategy.load_checkpoint(newest.url)
        trainer.strategy.load_model_state_dict(checkpoint, strict=True)
        trainer.strategy.load_optimizer_state_dict(checkpoint)
        if isinstance(trainer.lightning_module, BlocksModule):
            trainer.lightning_module.apply_optim_settings()
        return True

    def check_row(self, trainer: pl.Trainer, row: Row) -> None:
        """On a logged row: stop on a non-finite loss or gradient norm (``stop``); divergence; warn on a gradient spike."""
        if self.policy == "stop":
            for name in ("train/loss",) if self.grad_scaler else ("train/loss", "grad_norm"):
                if name in row and not math.isfinite(row[name]):
                    raise NonFiniteError(
                        f"{name} is {row[name]} at step {trainer.global_step} (monitor.on_nonfinite=stop); "
                        "lower optim.lr, clip gradients (optim.grad_clip), or choose monitor.on_nonfinite=skip "
                        "or rollback"
                    )
        self._check_divergence(trainer, row.get("train/loss"))
        norm = row.get("grad_norm")
        if self.spike_factor and norm is not None and math.isfinite(norm):
            if len(self._norms) >= SPIKE_MIN_HISTORY:
                median = statistics.median(self._norms)
                if median > 0 and norm > self.spike_factor * median:
                    self.grad_spikes += 1
                    if trainer.is_global_zero:
                        log.warning(
                            "step %d: gradient norm %.4g is %.1f× the running median %.4g "
                            "(monitor.grad_spike_factor=%g)",
                            trainer.global_step,
                            norm,
                            norm / median,
                            median,
                            self.spike_factor,
                        )
            self._norms.append(norm)

    def _check_divergence(self, trainer: pl.Trainer, loss: float | None) -> None:
        """A finite loss above ``divergence_factor`` × the first counted step's loss: apply the policy.

        The loss is the mean over ranks, so every rank decides the same.
        """
        first_loss = self._divergence_baseline()
        if not self.divergence_factor or loss is None or not math.isfinite(loss) or first_loss is None:
            return
        if not math.isfinite(first_loss) or first_loss <= 0:
            return
        if loss <= self.divergence_factor * first_loss:
            return
        self.divergences += 1
        what = (
            f"train/loss is {loss:.4g} at step {trainer.global_step}, over monitor.loss_divergence_factor="
            f"{self.divergence_factor:g} × the first counted step's loss {first_loss:.4g}: training diverged"
        )
        if self.policy == "stop":
            raise DivergenceError(
                f"{what} (monitor.on_nonfinite=stop); lower optim.lr, clip gradients (optim.grad_clip), or raise "
                "monitor.loss_divergence_factor (0 turns the check off)"
            )
        if self.policy == "rollback" and self._rollback(trainer):
            self.rollbacks += 1
            if trainer.is_global_zero:
                log.warning("%s; rolled back to the last committed checkpoint", what)
        elif trainer.is_global_zero:
            log.warning("%s; lower optim.lr or clip gradients (optim.grad_clip)", what)

    def _divergence_baseline(self) -> float | None:
        """The first counted step's loss (read from the device when needed); None before a step counted.

        Once it is read, :meth:`on_train_batch_end` has nothing more to do for the run.
        """
        if self._first_loss is None and self._first_loss_on_device is not None:
            first_loss = float(self._first_loss_on_device)
            if math.isfinite(first_loss):
                self._first_loss, self._first_loss_on_device = first_loss, None
                dispatch_hook(self, "on_train_batch_end", False)
        return self._first_loss

    def row(self) -> Row:
        """Counters for the metrics row (only once something happened), and a fresh window."""
        self.skipped_in_window = 0
        out: Row = {}
        if self.skipped_steps:
            out["health/skipped_steps"] = float(self.skipped_steps)
        if self.rollbacks:
            out["health/rollbacks"] = float(self.rollbacks)
        if self.grad_spikes:
            out["health/grad_spikes"] = float(self.grad_spikes)
        if self.divergences:
            out["health/divergences"] = float(self.divergences)
        return out


def skips_on_device(optimizer: Any) -> bool:
    """Whether *optimizer* skips a step itself on a device-side ``found_inf``: torch's Adam/AdamW, every group fused.

    torch's fused SGD accepts ``found_inf`` too, but a skipped first step leaves its momentum
    buffer uninitialised, so SGD keeps the host-side check.
    """
    return isinstance(optimizer, torch.optim.Adam) and all(
        group.get("fused") for group in optimizer.param_groups
    )


class _DeviceSkips:
    """Skipped-step counters that live on the device: skipped steps, the current and the longest run of them."""

    def __init__(self, device: torch.device, run: int = 0) -> None:
        """Start counting on *device*, *run* bad steps in a row already (a resumed run's, from its checkpoint)."""
        # skipped since the last read, current run, longest run
        self.counts = torch.tensor([0.0, run, run], device=device)

    def add(self, bad: torch.Tensor) -> None:
        """Count one step; *bad* is 1.0 when it was skipped, else 0.0 (no host sync)."""
        skipped, run, longest = self.counts.unbind()
        run = (run + 1) * bad
        self.counts = torch.stack([skipped + bad, run, torch.maximum(longest, run)])

    def peek(self) -> int:
        """Skipped steps since the last read, leaving the window open (one host read)."""
        return int(self.counts[0].item())

    def snapshot(self) -> tuple[int, int, int]:
        """Skipped steps, the current run and the longest run since the last read, leaving the window open."""
        skipped, run, longest = (int(value) for value in self.counts.tolist())
        return skipped, run, longest

    def read(self) -> tuple[int, int]:
        """Skipped steps and the longest run since the last read; starts a new window (the current run goes on)."""
        skipped, run, longest = self.snapshot()
        self.counts = torch.tensor([0.0, run, run], device=self.counts.device)
        return skipped, longest


class StallError(BaseException):
    """Raised in the main thread of a run its stall watchdog found stalled, when other work shares the process.

    A :class:`BaseException`, like :class:`KeyboardInterrupt`: it interrupts the code that hung,
    and an ``except Exception`` there must not swallow it.
    """


STALL_SIGNAL = getattr(signal, "SIGUSR2", None)
"""The signal the watchdog sends its own process's main thread to interrupt a stalled run (a sleep or a wait included)."""


class StallWatchdog(pl.Callback):
    """Fails the job when no training or validation batch finishes for ``timeout_s`` seconds.

    Every rank runs a watchdog thread. When it fires it dumps the Python stack of every thread
    of its process to ``<run dir>/stacks/rank<R>-attempt<N>.txt`` (``faulthandler``) and waits
    a few seconds for the other ranks' dumps. Then:

    - a process that runs this one job (*exits_process*: a torchrun, srun, mpirun or Ray worker)
      lets *on_stall(reason, step)* record the failure (on global rank 0 only: it writes
      ``summary.json``) and exits with status 3, so torchrun stops the job or restarts it
      (``trainer.max_failures``);
    - a process that goes on after the job (``blocks run`` training in its own process, a sweep
      of such jobs, the Python API) first interrupts its main thread (:data:`STALL_SIGNAL`),
      which raises :class:`StallError` where it hangs: the run fails like any other and the
      process goes on. Only when the main thread does not come back within *grace_s* (stuck
      in code that never returns to Python), or the job does not end (:meth:`end_job`) within
      *grace_s* or *timeout_s*, the longer, after it came back (its teardown waits on a checkpoint save that never returns),
      is the failure recorded as above and the process ended with status 3. So is a run that
      trains outside the main thread (the Python API called from another thread), which no
      signal can interrupt.
    """

    def __init__(
        self,
        timeout_s: float,
        run_dir: Path,
        *,
        on_stall: Callable[[str, int], None],
        grace_s: float | None = None,
        exits_process: bool = True,
    ) -> None:
        self.timeout_s = timeout_s
        self.run_dir = run_dir
        self.on_stall = on_stall
        self.grace_s = STALL_GRACE_S if grace_s is None else grace_s
        self.exits_process = exits_process
        self.reason = ""
        self._last_beat = time.monotonic()
        self._step = 0
        self._stop = threading.Event()
        self._fired = threading.Event()
        self._lock = threading.RLock()  # re-entered by the signal handler, in the main thread
        # who ends a stalled run: "main" (the run's own thread came back) or "watchdog"
        self._ended_by: str | None = None
        self._main_back = threading.Event()
        self._raised = False  # StallError was raised in the main thread: the job's end is still watched
        self._job_ended = threading.Event()
        self._on_main_thread = True
        self._signal_taken = False
        self._previous_handler: Any = None
        self._thread: threading.Thread | None = None
        self._rank = int(os.environ.get("RANK", "0"))
        self._world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self._attempt = restart_count()
        self._injected = _parse_injection(os.environ.get(STALL_ENV)) if self._attempt == 0 else None

    def _beat(self, trainer: pl.Trainer) -> None:
        self._last_beat = time.monotonic()
        self._step = trainer.global_step

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start the watchdog thread (and, when the process goes on after the run, take :data:`STALL_SIGNAL`)."""
        self._rank, self._world_size = trainer.global_rank, trainer.world_size
        self._beat(trainer)
        self._stop.clear()
        self._fired.clear()
        self._main_back.clear()
        self._job_ended.clear()
        self._raised = False
        self._ended_by = None
        self._on_main_thread = _in_main_thread()
        if not self.exits_process and not self._on_main_thread:
            log.warning(
                "training runs outside the main thread (%s), where the stall watchdog cannot interrupt "
                "it: a stall (monitor.stall_timeout_s=%g) ends the whole process with status %d",
                threading.current_thread().name,
                self.timeout_s,
                STALL_EXIT_CODE,
            )
        if not self.exits_process and STALL_SIGNAL is not None and self._on_main_thread:
            self._previous_handler = signal.signal(STALL_SIGNAL, self._interrupted)
            self._signal_taken = True
        self._thread = threading.Thread(target=self._watch, name="blocks-stall-watchdog", daemon=True)
        self._thread.start()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """A heartbeat; the fault-injection hook sleeps here."""
        self._beat(trainer)
        if self._injected and self._injected[:2] == (trainer.global_rank, trainer.global_step):
            rank, step, seconds = self._injected
            log.warning("%s: rank %d stalls for %gs after step %d", STALL_ENV, rank, seconds, step)
            time.sleep(seconds)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """A heartbeat."""
        self._beat(trainer)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """A heartbeat (a save can take a while)."""
        self._beat(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Stop watching: what follows (final validation, weights) is not a training step."""
        self._stand_down()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Stop watching a run that failed (a stall this watchdog interrupted included)."""
        self._stand_down()

    def _stand_down(self) -> None:
        """The main thread left training: stop the thread, give the signal back, and end the stall (if any) from here."""
        self._stop.set()
        with self._lock:  # not while the watchdog sends the signal: it must find this handler
            self._claim("main")
            if self._signal_taken and _in_main_thread():
                previous = self._previous_handler
                signal.signal(STALL_SIGNAL, signal.SIG_DFL if previous is None else previous)  # type: ignore[arg-type]
                self._signal_taken, self._previous_handler = False, None

    def _claim(self, by: str) -> bool:
        """Make *by* the one that ends a stalled run, unless the other already is; whether *by* is."""
        with self._lock:
            if self._ended_by is None:
                self._ended_by = by
                if by == "main":
                    self._main_back.set()
            return self._ended_by == by

    def _interrupted(self, signum: int, frame: Any) -> None:
        """:data:`STALL_SIGNAL` in the main thread: raise :class:`StallError` there, once the watchdog fired.

        Not once training has ended meanwhile (:meth:`_stand_down`): nothing is stuck any more.
        """
        if self._fired.is_set() and not self._stop.is_set() and self._claim("main"):
            self._raised = True
            raise StallError(self.reason)
        previous = self._previous_handler
        if callable(previous):
            previous(signum, frame)

    def end_job(self) -> bool:
        """The job this watchdog watched has ended, teardown included; whether the watchdog records its stall itself.

        Called by the run's own thread before it records the run (every run, stalled or not).
        From here on the watchdog stays quiet; True when it already took over (it writes the
        summary and ends the process): the run's own thread must then record nothing.
        """
        self._stop.set()
        with self._lock:
            self._job_ended.set()
            return self.fired

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            idle = time.monotonic() - self._last_beat
            if idle >= self.timeout_s:
                self._fire(idle)
                return

    @property
    def fired(self) -> bool:
        """Whether this watchdog records the stall itself and ends the process (the run's own thread does not come back)."""
        return self._fired.is_set() and self._ended_by == "watchdog"

    def _fire(self, idle: float) -> None:
        if self.exits_process and not self._claim("watchdog"):
            return  # training ended in its own thread meanwhile: no stall
        self._fired.set()
        directory = self.run_dir / STACKS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"rank{self._rank}-attempt{self._attempt}.txt"
        with path.open("w") as fh:
            fh.write(f"rank {self._rank}: no training step for {idle:.0f}s after step {self._step}\n")
            fh.flush()
            faulthandler.dump_traceback(fh, all_threads=True)
        pattern = f"rank*-attempt{self._attempt}.txt"
        _wait_for(lambda: len(list(directory.glob(pattern))) >= self._world_size, self.grace_s)
        self.reason = (
            f"stalled: no training step for {self.timeout_s:g}s after step {self._step} "
            f"(monitor.stall_timeout_s); Python stacks of every rank in {directory}"
        )
        print(f"blocks: {self.reason}", flush=True)
        if not self.exits_process:
            why = self._interrupt_or_why_not()
            if why is None:
                return  # the run failed in its own thread and ended, which records it; the process goes on
            print(
                f"blocks: {why}: the process ends with status {STALL_EXIT_CODE}, and what it would run "
                "after this job (the next jobs of a sweep) does not run; the same command again resumes",
                flush=True,
            )
        self._record_and_exit()

    def _interrupt_or_why_not(self) -> str | None:
        """Interrupt the main thread and wait for the job to end; None when it did, else why the watchdog ends it.

        The watchdog takes the stall over (:attr:`fired`) before it says why.
        """
        if not self._on_main_thread:
            return (
                "training runs outside the main thread, where the stall watchdog cannot interrupt it"
                if self._claim("watchdog")
                else None  # training ended meanwhile
            )
        if not (self._interrupt_main() and self._main_back.wait(self.grace_s)):
            return (
                f"training did not stop within {self.grace_s:g}s of the stall (it hangs outside Python)"
                if self._claim("watchdog")
                else None
            )
        # The teardown may finish a background save and gather the weights: as long as a step may take.
        teardown_s = max(self.grace_s, self.timeout_s)
        if not self._raised or self._job_ended.wait(teardown_s):
            return None
        with self._lock:
            if self._job_ended.is_set():
                return None
            self._ended_by = "watchdog"  # the run's own thread must not record the job over this
        return (
            f"training stopped, but the job did not end within {teardown_s:g}s after it (its teardown "
            "waits, e.g. on a background checkpoint save that does not return)"
        )

    def _interrupt_main(self) -> bool:
        """Send :data:`STALL_SIGNAL` to the main thread, which raises :class:`StallError`; False when it cannot."""
        with self._lock:
            if not self._signal_taken or STALL_SIGNAL is None:
                return False  # the run does not train in the main thread, or training ended meanwhile
            signal.pthread_kill(threading.main_thread().ident or 0, STALL_SIGNAL)
            return True

    def _record_and_exit(self) -> None:
        """Have rank 0 record the stall (the others wait until it has), then end the process with status 3."""
        directory = self.run_dir / STACKS_DIR
        recorded = directory / f".recorded-attempt{self._attempt}"
        try:
            if self._rank == 0:
                self.on_stall(self.reason, self._step)
                recorded.touch()
            else:
                # The first rank to exit makes torchrun stop the others: wait until rank 0 has
                # written the stall into summary.json, or the job's account would be a SIGTERM.
                _wait_for(recorded.exists, self.grace_s)
        finally:
            # The main thread is blocked inside a collective that never returns (a peer is gone),
            # and an exception raised in this watchdog thread would end only this thread: ending
            # the process from here is the one way out, so torchrun sees the failure and restarts.
            logging.shutdown()
            os._exit(STALL_EXIT_CODE)


def _in_main_thread() -> bool:
    """Whether this is the main thread (the only one that may set a signal handler)."""
    return threading.current_thread() is threading.main_thread()


def _wait_for(condition: Callable[[], bool], patience_s: float) -> None:
    """Poll *condition* until it holds or *patience_s* has passed."""
    deadline = time.monotonic() + patience_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)


def end_stall_watch(trainer: pl.Trainer) -> bool:
    """Tell *trainer*'s stall watchdog the job has ended (:meth:`StallWatchdog.end_job`); whether it records the stall itself.

    True when it took the stall over: it writes the summary and ends the process. Not when it
    interrupted the run's own thread (:class:`StallError`) and the job ended in time: that
    thread records the failure as any other.

    The watchdog's own state, not the process's: a stall in one run says nothing of the next
    run in the same process (in-process runs, tests).
    """
    watchdogs = [cb for cb in trainer.callbacks if isinstance(cb, StallWatchdog)]  # type: ignore[attr-defined]
    return any([watchdog.end_job() for watchdog in watchdogs])  # every one of them is told


def _parse_injection(value: str | None) -> tuple[int, int, float] | None:
    """``RANK:STEP:SECONDS`` from :data:`STALL_ENV`, or None."""
    if not value:
        return None
    rank, step, seconds = value.split(":")
    return int(rank), int(step), float(seconds)
