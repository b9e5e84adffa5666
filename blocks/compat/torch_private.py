"""torch and Lightning internals behind one seam; see :mod:`blocks.compat` (DCP's are in :mod:`blocks.compat.dcp_private`)."""

from __future__ import annotations

import contextlib
import functools
import pickle
import signal
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import IO, Any, cast

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.apply_func import _BLOCKING_DEVICE_TYPES, move_data_to_device
from pytorch_lightning.trainer.connectors.signal_connector import _SignalConnector
from pytorch_lightning.utilities.model_helpers import is_overridden
from pytorch_lightning.utilities.signature_utils import is_param_in_hook_signature
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp._fully_shard._fsdp_common import _cast_fp_tensor
from torch.distributed.utils import _apply_to_tensors
from torch.serialization import DEFAULT_PROTOCOL, _get_storage_alignment, _save

__all__ = [
    "DirectBatchTransfer",
    "DirectHookNameWrites",
    "activation_checkpointed",
    "cast_floating_tensors",
    "compile_forwards_in_place",
    "compile_in_place",
    "dispatch_hook",
    "drop_inherited_step_hooks",
    "loader_worker_done_event",
    "loss_scale_in_gradients",
    "processed_micro_batches",
    "read_step_signature_once",
    "replace_signal_handlers",
    "save_without_zip_crc",
    "saved_batch_progress",
    "saved_epoch_progress",
    "saved_train_loader_state",
    "set_found_inf",
    "set_last_lr",
    "skip_automatic_hyperparameters",
    "start_programs_with_sigterm_unblocked",
    "tensor_norms_in_float32",
    "tensorboard_hparams",
    "tensors_to_device",
]


def activation_checkpointed(layer: nn.Module) -> nn.Module:
    """*layer* recomputing its activations in backward (``torch.distributed.algorithms._checkpoint``)."""
    return checkpoint_wrapper(layer, preserve_rng_state=True)


def compile_in_place(module: nn.Module, **options: Any) -> None:
    """``module.compile(**options)`` that also compiles a module whose forward is torch.nn's own (``nn.Sequential``).

    ``nn.Module.compile`` hands ``torch.compile`` the module's ``_call_impl``: dynamo skips that
    torch.nn frame (and, for that name only, adds no frame of its own around it), so when the
    forward is in torch.nn too, nothing is traced and the module silently runs eagerly. Here the
    compiled function is a frame of ours that calls ``_call_impl``: dynamo traces it, inlining
    the module's hooks and forward as ``torch.compile(module)`` does. It is kept where
    ``compile`` keeps its own (``_compiled_call_impl``): parameter names do not change, and a
    copy or pickle of the module drops it (an uncompiled copy, never one calling the original).
    """
    call = module._call_impl

    def call_module(*args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)

    module._compiled_call_impl = torch.compile(_with_own_code(call_module), **options)


def compile_forwards_in_place(modules: Iterable[nn.Module], **options: Any) -> None:
    """Compile each of *modules*' forward, not its hooks: those registered later (FSDP2's) run outside the graph.

    What torchtitan gets by compiling each transformer block before ``fully_shard``, without the
    ``_orig_mod.`` wrapper that renames parameters. A :func:`compile_in_place` module runs its
    hooks inside the compiled function, and FSDP2's are dynamo-disabled: the graph breaks at
    them, and dynamo compiles only the frames it meets below that are not torch.nn's (a forward
    that is torch.nn's own, ``nn.Sequential``'s, runs eagerly). Here one compiled function, with
    a code object of its own, is bound to each module as its ``forward`` and calls its class's:
    modules of one class share its graphs; a deep copy is bound to the copy, a pickle drops it.
    """

    def forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return type(module).forward(module, *args, **kwargs)

    compiled = torch.compile(_with_own_code(forward), **options)
    for module in modules:
        # An instance attribute named as the method: a pickle stores getattr(module, "forward").
        module.forward = types.MethodType(compiled, module)


def _with_own_code(function: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of *function* with a code object of its own.

    Dynamo keeps its graphs and its recompile budget per code object: without one of each
    model's own, every model a process compiles (a sweep's jobs) would share one budget.
    """
    plain = cast("types.FunctionType", function)
    return types.FunctionType(
        plain.__code__.replace(),
        plain.__globals__,
        plain.__name__,
        None,
        plain.__closure__,
    )


def cast_floating_tensors(dtype: torch.dtype, tree: Any) -> Any:
    """*tree* (tensors in tuples, lists, dicts, dataclasses) with its floating tensors cast to *dtype*.

    FSDP2's own cast of a unit's forward inputs (``cast_forward_inputs``) and outputs (``output_dtype``).
    """
    return _apply_to_tensors(functools.partial(_cast_fp_tensor, dtype), tree)


def processed_micro_batches(trainer: pl.Trainer) -> int:
    """Micro-batches training has processed in the current epoch (Lightning's loop progress counters)."""
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    return int(current.processed)  # type: ignore[attr-defined]  # a _ProcessedTracker at runtime


def saved_batch_progress(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The epoch loop's batch progress Lightning saved in *checkpoint* (its ``loops`` layout), or None."""
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
    return progress if isinstance(progress, dict) else None


def saved_epoch_progress(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The fit loop's epoch progress Lightning saved in *checkpoint* (its ``loops`` layout), or None."""
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress")
    return progress if isinstance(progress, dict) else None


def saved_train_loader_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The state the training loader saved in *checkpoint* (Lightning's ``combined_loader`` entry), or None."""
    saved = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {}).get("combined_loader")
    first = saved[0] if isinstance(saved, list) and saved else None
    return first if isinstance(first, dict) else None


SignalHandler = Callable[[int, FrameType | None], None]


def replace_signal_handlers(trainer: pl.Trainer, handler: SignalHandler, signals: Sequence[int]) -> None:
    """Make *trainer* install *handler* for *signals* when fit/validate starts, instead of Lightning's own.

    Lightning registers its handlers from the private ``trainer._signal_connector`` (a
    ``_SignalConnector``) at the start of each loop; this swaps in a subclass that installs
    *handler* (main thread only: Python allows no other) and keeps the rest (restoring the
    previous handlers at teardown).
    """
    trainer._signal_connector = _HandlerConnector(trainer, handler, signals)


class _HandlerConnector(_SignalConnector):
    """Lightning's signal connector with one handler for the given signals."""

    def __init__(self, trainer: pl.Trainer, handler: SignalHandler, signals: Sequence[int]) -> None:
        super().__init__(trainer)
        self.handler = handler
        self.signals = tuple(signals)

    def register_signal_handlers(self) -> None:
        """Install the handler (main thread only; Python allows no other)."""
        self.received_sigterm = False
        self._original_handlers = self._get_current_signal_handlers()
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                signal.signal(signum, self.handler)


_WORKER_MODULE = "torch.utils.data._utils.worker"


def loader_worker_done_event() -> Any | None:
    """Called from a DataLoader's ``worker_init_fn``: the event its loader sets before it ends its workers.

    torch's ``_worker_loop`` (which calls the ``worker_init_fn``) holds it as ``done_event``;
    None when not called from there.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_worker_loop" and frame.f_globals.get("__name__") == _WORKER_MODULE:
            return frame.f_locals.get("done_event")
        frame = frame.f_back  # type: ignore[assignment]
    return None


def start_programs_with_sigterm_unblocked() -> None:
    """Make :mod:`subprocess` start its programs, in this process, with SIGTERM unblocked.

    A program inherits the signal mask of the thread that starts it, and ``subprocess`` runs no
    Python code (no fork hooks) between its fork and the exec: the thread that starts one lets
    SIGTERM through meanwhile (``Popen._execute_child``), so a SIGTERM may reach it there.
    """
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    if getattr(execute_child, "unblocks_sigterm", False):
        return

    def with_sigterm_unblocked(self: subprocess.Popen, *args: Any, **kwargs: Any) -> None:
        mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        try:
            execute_child(self, *args, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    with_sigterm_unblocked.unblocks_sigterm = True  # type: ignore[attr-defined]
    subprocess.Popen._execute_child = with_sigterm_unblocked  # type: ignore[attr-defined]


def skip_automatic_hyperparameters(*objects: pl.LightningModule | pl.LightningDataModule) -> None:
    """Stop Lightning logging *objects*' ``hparams`` at fit start (``_log_hyperparams``): blocks logs the whole config itself."""
    for obj in objects:
        obj._log_hyperparams = False


def tensorboard_hparams(writer: Any, params: dict[str, Any], metric_names: Sequence[str]) -> None:
    """Write *params* for TensorBoard's HParams tab into *writer* (a ``SummaryWriter``), showing *metric_names*.

    What Lightning's ``TensorBoardLogger.log_hyperparams`` writes, without the placeholder
    ``hp_metric`` scalar it logs unless given a metric value: the tab reads each metric's last value.
    """
    from torch.utils.tensorboard.summary import hparams

    file_writer = writer._get_file_writer()
    for summary in hparams(params, dict.fromkeys(metric_names, 0.0)):
        file_writer.add_summary(summary)


def save_without_zip_crc(obj: Any, fh: IO[bytes]) -> None:
    """``torch.save(obj, fh)`` without the zip CRC32 of each record, for files a digest already covers.

    ``torch.serialization.set_crc32_options(False)`` does the same for the whole process; this
    leaves other threads' saves alone. ``torch.load`` does not check the CRC32 (torch's own
    reader is built without that check), so the file loads as usual.
    """
    writer = torch._C.PyTorchFileWriter(fh, False, _get_storage_alignment())
    try:
        _save(obj, writer, pickle, DEFAULT_PROTOCOL, False)
    except BaseException:
        # Finish the writer now, while *fh* is open, as torch.save's context manager does. Left
        # unfinished, it writes its end-of-file record from its C++ destructor whenever garbage
        # collection frees it (the traceback keeps it alive); by then *fh* is closed, the write
        # fails there, and the error aborts the whole process (SIGABRT) in unrelated code.
        with contextlib.suppress(Exception):
            writer.write_end_of_file()
        raise
    writer.write_end_of_file()
    fh.flush()


class DirectHookNameWrites:
    """For a ``LightningModule``: Lightning's writes of the running hook's name skip ``nn.Module.__setattr__``.

    Lightning's dispatchers (``trainer.call``) set ``module._current_fx_name`` before and after
    every hook, callback and strategy hook they call: about 34 writes a training step, each
    through ``nn.Module.__setattr__``, which checks the value against parameters, submodules and
    buffers first. A string or None is none of those, so it is written to the instance directly.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_current_fx_name" and (value is None or type(value) is str):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)


BATCH_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")
"""The hooks a batch passes through on its way to the device, in the module or the datamodule."""


class DirectBatchTransfer:
    """For a ``LightningModule``: a batch moves to the device without three hook dispatches when no hook changes it.

    Lightning sends every batch through :data:`BATCH_HOOKS`, looking each up on the datamodule
    and the module (``_DataHookSelector.get_instance``: two ``is_overridden`` a hook) and
    dispatching it with a profiler context and two hook-name writes: about 3% of a small
    model's step. When neither the module nor the trainer's datamodule overrides any of them,
    that is ``move_data_to_device(batch, device)``, which is what this does; otherwise
    Lightning's path runs. The answer is read once per datamodule class.
    """

    _batch_hooks_read_for: tuple[Any, bool] | None = None

    def _on_before_batch_transfer(self, batch: Any, dataloader_idx: int = 0) -> Any:
        if self._batch_hooks_are_lightnings():
            return batch
        return super()._on_before_batch_transfer(batch, dataloader_idx)  # type: ignore[misc]

    def _apply_batch_transfer_handler(
        self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0
    ) -> Any:
        if self._batch_hooks_are_lightnings():
            return tensors_to_device(batch, device or self.device)  # type: ignore[attr-defined]
        return super()._apply_batch_transfer_handler(batch, device, dataloader_idx)  # type: ignore[misc]

    def _batch_hooks_are_lightnings(self) -> bool:
        trainer = self._trainer  # type: ignore[attr-defined]
        datamodule = trainer.datamodule if trainer is not None else None
        read = self._batch_hooks_read_for
        if read is None or read[0] is not type(datamodule):
            owners = [self] if datamodule is None else [self, datamodule]
            plain = not any(is_overridden(hook, owner) for hook in BATCH_HOOKS for owner in owners)
            read = (type(datamodule), plain)
            object.__setattr__(self, "_batch_hooks_read_for", read)  # not an nn.Module attribute
        return read[1]


def tensors_to_device(batch: Any, device: torch.device | str) -> Any:
    """``move_data_to_device(batch, device)``, with a short path for a ``dict`` of plain tensors (blocks' batches).

    Lightning's ``apply_to_collection`` walks the batch with an ``isinstance`` check against a
    protocol class per element; for a flat dict of tensors that walk costs several times the
    ``Tensor.to`` calls themselves. The short path makes the same calls: ``non_blocking`` except
    to the CPU and MPS (``_BLOCKING_DEVICE_TYPES``), into a new dict.
    """
    if type(batch) is dict:
        if type(device) is not torch.device:
            device = torch.device(device)
        non_blocking = device.type not in _BLOCKING_DEVICE_TYPES
        moved = {}
        for name, value in batch.items():
            if type(value) is not torch.Tensor:
                return move_data_to_device(batch, device)
            moved[name] = value.to(device, non_blocking=non_blocking)
        return moved
    return move_data_to_device(batch, device)


STEP_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)
"""Hooks Lightning calls on every callback and on the module in every training (micro-)step, whose return value
it ignores. (The validation batch hooks stay: Lightning inspects the module's signatures of those.)"""


def drop_inherited_step_hooks(obj: pl.Callback | pl.LightningModule) -> list[str]:
    """Turn off the per-step hooks *obj* inherits as no-ops; returns their names.

    Lightning's dispatchers (``trainer.call._call_callback_hooks`` and
    ``_call_lightning_module_hook``) skip an attribute that is not callable, but call an
    inherited no-op through a profiler context and two ``_current_fx_name`` writes: about 30
    dispatches per step for blocks' callbacks, a measurable share of a small model's step. An
    instance attribute of ``None`` shadows the no-op, so the dispatcher skips it.
    """
    base = pl.LightningModule if isinstance(obj, pl.LightningModule) else pl.Callback
    dropped = []
    for name in STEP_HOOKS:
        if getattr(type(obj), name, None) is getattr(base, name):
            dispatch_hook(obj, name, wanted=False)
            dropped.append(name)
    return dropped


def dispatch_hook(obj: pl.Callback | pl.LightningModule, name: str, wanted: bool) -> None:
    """Have Lightning call *obj*'s hook *name* from now on (*wanted*), or skip it until wanted again.

    For a hook that has no work to do (an inherited no-op, a check the run's settings turn off,
    a value recorded once): skipped, it costs the dispatcher one ``getattr`` a step instead of a
    profiler context and two hook-name writes. An instance attribute of ``None`` shadows the
    method, which the dispatcher skips; removing it brings the method back.
    """
    if wanted:
        obj.__dict__.pop(name, None)
    else:
        setattr(obj, name, None)


def read_step_signature_once(trainer: pl.Trainer, module: pl.LightningModule) -> None:
    """Make *trainer* read *module*'s ``training_step`` signature once, not before every step.

    ``_TrainingEpochLoop._build_kwargs`` asks ``is_param_in_hook_signature`` (an
    ``inspect.getfullargspec``) on every batch whether ``training_step`` takes ``batch_idx``:
    about 5% of a small model's step. A method's signature does not change during a fit, so
    the epoch loop gets a ``_build_kwargs`` that answers from one reading.
    """
    takes_batch_idx = is_param_in_hook_signature(module.training_step, "batch_idx", min_args=2)

    def build_kwargs(kwargs: dict[str, Any], batch: Any, batch_idx: int) -> dict[str, Any]:
        kwargs["batch"] = batch
        if takes_batch_idx:
            kwargs["batch_idx"] = batch_idx
        return kwargs

    trainer.fit_loop.epoch_loop._build_kwargs = build_kwargs  # type: ignore[method-assign,assignment]


def loss_scale_in_gradients(trainer: pl.Trainer, optimizer: Any) -> torch.Tensor | None:
    """The loss scale *optimizer*'s gradients still carry in ``on_before_optimizer_step``, on the device; None if none.

    Lightning's mixed-precision plugin unscales the gradients before that hook, except for an
    optimizer that unscales them inside its own step (``_step_supports_amp_scaling``: torch's
    fused Adam, AdamW and SGD): theirs are still multiplied by the gradient scaler's scale. That
    is the scaler's own tensor (``_get_scale_async``, no host sync), which ``scaler.update()``
    changes in place after the step: divide by it in the hook, do not keep it.
    """
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if (
        scaler is None
        or not scaler.is_enabled()
        or not getattr(optimizer, "_step_supports_amp_scaling", False)
    ):
        return None
    return scaler._get_scale_async()


def set_found_inf(optimizer: Any, found_inf: Any) -> None:
    """Hand a fused torch optimizer a device-side ``found_inf`` (1.0: skip this step; None: no verdict).

    torch's fused Adam/AdamW/SGD read it from the ``found_inf`` attribute in ``step`` (the
    gradient scaler sets it the same way) and leave weights, moments and step counts alone
    when it is non-zero, without a host sync. Unfused optimizers refuse the attribute.
    """
    optimizer.found_inf = found_inf


def set_last_lr(scheduler: torch.optim.lr_scheduler.LRScheduler, rates: list[Any]) -> None:
    """What the scheduler's ``get_last_lr()`` returns (and its ``state_dict`` saves) until its next step.

    torch sets it only in ``step``; a scheduler whose groups' LRs were set by hand keeps reporting
    the old ones otherwise.
    """
    scheduler._last_lr = rates


def tensor_norms_in_float32(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's L2 norm, accumulated and returned in float32 at least (float64 stays float64).

    torch's ``get_total_norm`` returns each norm in its tensor's dtype, so the norms of bfloat16
    gradients are rounded to 3 significant digits (and differ with the sharding that groups
    them); the foreach norm's ``dtype`` widens each result instead of copying the tensors.
    DTensors (FSDP's sharded gradients) stay DTensors.
    """
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_device.setdefault(tensor.device, []).append(tensor)
    norms: list[torch.Tensor] = []
    for group in by_device.values():
        wide = torch.float64 if any(t.dtype == torch.float64 for t in group) else torch.float32
        norms.extend(torch._foreach_norm(group, 2, dtype=wide))
    return norms
