"""When to save, what to restore: the checkpoint callback, resumable loading and resume resolution."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from blocks.checkpoint import store
from blocks.checkpoint.base import CheckpointBlock
from blocks.checkpoint.io import FsspecCheckpointIO
from blocks.compat.torch_private import (
    saved_batch_progress,
    saved_epoch_progress,
    saved_train_loader_state,
)
from blocks.runtime.ranks import every_rank, rank_and_world

log = logging.getLogger(__name__)


class ResumableLoader(DataLoader):
    """A DataLoader whose position in the global batch stream survives a restart.

    Lightning saves its ``state_dict`` with the loop state and calls ``load_state_dict``
    before iterating again. The position is counted in optimizer steps of the current epoch
    (read from Lightning's progress, not from the iterator, which prefetches), so a resume on
    another world size or accumulation continues the same stream as long as the global batch
    is the same.
    """

    def __init__(
        self, *args: Any, progress: Callable[[], tuple[int, int]], accumulate: int, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._progress = progress
        self._accumulate = accumulate

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "steps_done", "global_batch", "accumulate"}`` at this moment of training."""
        _, micro_batches = self._progress()
        return {
            "epoch": self.batch_sampler.sampler.epoch,  # type: ignore[union-attr]
            "steps_done": micro_batches // self._accumulate,
            "global_batch": self.batch_sampler.global_batch,  # type: ignore[union-attr]
            "accumulate": self._accumulate,
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Skip the steps already taken in the saved epoch on the next pass over it."""
        self.batch_sampler.resume_at(epoch=state["epoch"], steps_done=state["steps_done"])  # type: ignore[union-attr]


def _inferred_accumulate(progress: Mapping[str, Any], loader: Mapping[str, Any]) -> int | None:
    """The accumulation of a checkpoint saved before it was recorded: micro-batches per step of its epoch."""
    steps, micro_batches = loader.get("steps_done", 0), progress["current"].get("completed", 0)
    return micro_batches // steps if steps and micro_batches % steps == 0 else None


def _reopen_finished_epoch(checkpoint: dict[str, Any], steps_per_epoch: int) -> None:
    """Restore a checkpoint saved after its last epoch was counted finished so the batch stream goes on exactly.

    The final save (at the end of training) comes after Lightning counted the last epoch
    finished, though the loader's position is still in it (``steps_done`` of its epoch).
    Restored as is, Lightning starts the next epoch with the saved epoch's batch counter: the
    loader serves the next epoch from its start, but the epoch ends after only the steps the
    saved one had left, and an extension skips the rest. Saved in the middle of an epoch (a
    ``max_steps`` stop), the epoch is counted unfinished and goes on from ``steps_done``. Saved
    at its end (all *steps_per_epoch* done), it stays finished, and the next epoch starts at
    its first batch with its batch counter at zero: re-opened, it would end at once without a
    validation, and an EarlyStopping checking at the end of each epoch would find no metric.
    """
    epochs, loader = saved_epoch_progress(checkpoint), saved_train_loader_state(checkpoint)
    batches = saved_batch_progress(checkpoint)
    if not epochs or not loader or not batches:
        return
    trackers = (epochs["total"], epochs["current"])
    if not all(t["ready"] == t["started"] == t["processed"] == t["completed"] > 0 for t in trackers):
        return
    if steps_per_epoch and loader.get("steps_done", 0) >= steps_per_epoch:
        loader["epoch"], loader["steps_done"] = loader["epoch"] + 1, 0
        batches["current"] = dict.fromkeys(batches["current"], 0)  # as Lightning starts an epoch
        batches["is_last_batch"] = False
        return
    for tracker in trackers:
        tracker["processed"] = tracker["completed"] = tracker["started"] - 1


def rng_state() -> dict[str, Any]:
    """The random number generator states of the calling process (tensors and plain data only)."""
    import numpy as np

    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [kind, np.asarray(keys).tolist(), pos, has_gauss, gauss],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore generator states saved by :func:`rng_state`."""
    import numpy as np

    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, gauss_value = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss_value))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def restore_rank_streams(
    states: Sequence[Mapping[str, Any]], rank: int, fresh: Callable[[int], None]
) -> None:
    """Put back global rank *rank*'s generator states from a checkpoint's *states* (one per rank that saved it).

    A rank the saving run did not have (a resume on more processes) starts its data-parallel
    index's own streams with *fresh* (:meth:`blocks.runtime.seeds.RankStreams.start_fresh`):
    with rank 0's states it would draw rank 0's numbers (dropout masks, augmentations).
    """
    if rank < len(states):
        set_rng_state(states[rank])
    elif states:
        fresh(rank)


def validate_before_the_end(trainer: pl.Trainer) -> None:
    """Have Lightning validate the last step inside ``fit``, before :meth:`CheckpointCallback.on_train_end` saves.

    Lightning validates a step it is asked to stop at (``trainer.should_stop``) and, at
    ``max_steps``, none that ``val_check_interval`` does not divide; the worker then validated
    after ``fit``, after the final save, whose manifest did not record it. Every rank sets it at
    the same step. No validation runs without val batches (``limit_val_batches=0``).
    """
    trainer.should_stop = True


class CheckpointCallback(pl.Callback):
    """Saves committed checkpoints at the configured triggers and applies retention after each commit.

    Triggers: every ``every_n_steps`` optimizer steps, every ``every_seconds`` (rank 0's clock,
    broadcast), the end of training, and SIGTERM/SIGINT between optimizer steps. Its own state
    in each checkpoint is every rank's RNG states, and in the final one of a run a callback
    stopped early (``trainer.should_stop``) the steps that run was given: a rerun given no
    more ends at once, as a finished run's does. ``stall_s`` adds up the seconds training
    waited for saves. *metrics* gives the metrics logged at a step: a manifest holds those of
    its own step only, so ``keep_best`` never ranks a checkpoint by an earlier validation.
    The last step is validated before the final save, so the final manifest records that
    validation: a rerun with nothing left to train finds it there and validates nothing again.
    *fresh_streams* starts the streams of a rank the checkpoint it resumes has none of
    (:func:`restore_rank_streams`).
    """

    def __init__(
        self,
        block: CheckpointBlock,
        io: FsspecCheckpointIO,
        *,
        directory: str,
        accumulate: int,
        global_batch: int,
        world_size: int,
        block_digests: dict[str, str],
        resumed_from: str | None,
        metrics: Callable[[int], dict[str, float]],
        job: str = "",
        steps_per_epoch: int = 0,
        fresh_streams: Callable[[int], None],
        before_save: Callable[[pl.Trainer], None] = lambda trainer: None,
    ) -> None:
        self.block = block
        self.io = io
        self.directory = directory
        self.accumulate = accumulate
        self.global_batch = global_batch
        self.world_size = world_size
        self.block_digests = block_digests
        self.resumed_from = resumed_from
        self.job = job
        self.metrics = metrics
        self.before_save = before_save
        self.fresh_streams = fresh_streams
        self.steps_per_epoch = steps_per_epoch
        self.stopped_early_of: int | None = None
        self.last_saved_step = -1
        self.stall_s = 0.0
        self._pending = False
        self._last_save_time = time.monotonic()
        self._stale: set[str] = set()
        self._resumed_step: int | None = None
        self._between_batches = False
        io.after_commit = self._retain
        io.stale = lambda url: url in self._stale

    def state_dict(self) -> dict[str, Any]:
        """Every rank's RNG states (a collective: Lightning calls this on all ranks when saving), and :attr:`stopped_early_of`."""
        return {"rng": every_rank(rng_state()), "stopped_early_of": self.stopped_early_of}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore this rank's RNG states (see :func:`restore_rank_streams`)."""
        restore_rank_streams(state_dict.get("rng") or [], rank_and_world()[0], self.fresh_streams)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Remove checkpoints a crash left uncommitted (global rank 0, before anything is saved).

        Only directories blocks created (they carry its marker) are removed; other ``step-<N>``
        entries are reported and left alone.
        """
        self._resumed_step = store.read_manifest(self.resumed_from).step if self.resumed_from else None
        if trainer.is_global_zero:
            listing = store.list_dir(self.directory)
            start = self._resumed_step or 0
            self._stale = {c.url for c in listing.committed if c.manifest.step > start}
            for url in listing.uncommitted:
                log.warning("removing uncommitted checkpoint %s (a save that never finished)", url)
                store.remove(url)
            for url in listing.foreign:
                log.warning(
                    "%s looks like a checkpoint but was not written by blocks: leaving it alone "
                    "(move it out of checkpoint.dir)",
                    url,
                )
        trainer.strategy.barrier("blocks-checkpoint-cleanup")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Save on the step and time triggers, only at optimizer-step boundaries; ask for the last step's validation."""
        if (batch_idx + 1) % self.accumulate:
            return
        step = trainer.global_step
        if step >= trainer.max_steps:
            validate_before_the_end(trainer)
        due = bool(self.block.every_n_steps) and step % self.block.every_n_steps == 0
        if self.block.every_seconds:
            elapsed = time.monotonic() - self._last_save_time
            due = due or bool(trainer.strategy.broadcast(elapsed >= self.block.every_seconds))
        if due:
            self._pending = True

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A save due at this step waits for its validation, so its manifest holds fresh metrics."""
        if self._pending and not trainer.sanity_checking:
            self.save(trainer)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """A save due at the previous step that no validation followed happens now (nothing changed since)."""
        if self._pending:
            self._save_between_batches(trainer)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Record a save made between batches as made at the end of the previous one.

        Between batches: a save due at the previous step, or the save of a signal's stop
        (``Preempted`` is raised from ``on_train_batch_start`` too). Lightning has already
        counted the next batch as ready; restored as is, its batch counter runs one ahead after
        a resume, and validation comes one step early.
        """
        if not self._between_batches:
            return
        progress = saved_batch_progress(checkpoint)
        if progress:
            for tracker in (progress["total"], progress["current"]):
                tracker["ready"] = tracker["completed"]

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Count the restored micro-batches in this run's accumulation, before Lightning restores its loop.

        Lightning's batch counters hold micro-batches of the run that saved; resumed with
        another ``accumulate`` (the same global batch on another world size, or
        ``optim.accumulate`` changed), they would count steps wrongly, and so the data position
        every later checkpoint records. Each epoch holds whole optimizer steps, so the
        counters convert exactly. A final checkpoint's last epoch is set to go on first
        (:func:`_reopen_finished_epoch`). A run a callback stopped early, rerun with no more
        steps than it was given, stops before its first step: nothing is left to train.
        """
        stopped_of = checkpoint.get("callbacks", {}).get(self.state_key, {}).get("stopped_early_of")
        if stopped_of is not None and trainer.max_steps <= stopped_of:
            trainer.should_stop = True  # Lightning's fit loop then trains nothing
        _reopen_finished_epoch(checkpoint, self.steps_per_epoch)
        progress, loader = saved_batch_progress(checkpoint), saved_train_loader_state(checkpoint)
        if not progress or not loader:
            return
        saved = loader.get("accumulate") or _inferred_accumulate(progress, loader)
        if not saved or saved == self.accumulate:
            return
        for tracker in (progress["total"], progress["current"]):
            for counter in ("ready", "started", "processed", "completed"):
                if counter in tracker:
                    tracker[counter] = tracker[counter] // saved * self.accumulate

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The final checkpoint; it records the steps this run was given when a callback stopped it before them."""
        if trainer.should_stop and trainer.global_step < trainer.max_steps:
            self.stopped_early_of = trainer.max_steps
        self.save(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """On SIGTERM (preemption) or Ctrl-C, save before the job exits, between steps.

        Only a stop :class:`~blocks.runtime.preemption.Preemption` made (``Preempted``, raised
        at an optimizer-step boundary, on every rank at the same step). Any other interruption
        (a second Ctrl-C, which stops at once) can come in the middle of a step, even of the
        optimizer's update of the parameters, so the last checkpoint stands.
        """
        from blocks.runtime.preemption import Preempted

        if self.block.on_signal and isinstance(exception, Preempted):
            self._save_between_batches(trainer)

    def _save_between_batches(self, trainer: pl.Trainer) -> None:
        """Save from ``on_train_batch_start``, after Lightning counted the coming batch (see :meth:`on_save_checkpoint`)."""
        self._between_batches = True
        try:
            self.save(trainer)
        finally:
            self._between_batches = False

    def save(self, trainer: pl.Trainer) -> None:
        """Write and commit a checkpoint at the current step, then apply retention."""
        step = trainer.global_step
        url = store.join(self.directory, store.step_dir_name(step))
        if step == self.last_saved_step or step == 0 or self._stands(trainer, step, url):
            self.last_saved_step = max(self.last_saved_step, step)
            self._pending = False
            return
        self.before_save(trainer)
        self.io.pending_manifest = store.Manifest(
            step=step,
            epoch=trainer.current_epoch,
            world_size=self.world_size,
            sharded=False,
            global_batch=self.global_batch,
            block_digests=self.block_digests,
            metrics=self.metrics(step),
            job=self.job,
        )
        started = time.perf_counter()
        trainer.save_checkpoint(url, weights_only=False)
        self.stall_s += time.perf_counter() - started
        self.last_saved_step = step
        self._pending = False
        self._last_save_time = time.monotonic()

    def _stands(self, trainer: pl.Trainer, step: int, url: str) -> bool:
        """Whether the save of *step* at *url* is left out: the run is still at the step it resumed from.

        Nothing was trained since (a stop before the first step, or a rerun with no steps left):
        the checkpoint it resumed from holds this state already. Rewritten, it would be deleted
        first, and a kill during the rewrite would leave nothing to resume from. Resumed from
        another directory, the save is a copy into this one, made unless a committed checkpoint
        of that step is there already (never replaced: it is another run's).
        """
        if step != self._resumed_step or self.resumed_from is None:
            return False
        if store.same_place(url, self.resumed_from):
            if trainer.is_global_zero:
                log.info("nothing trained since step %d: the checkpoint resumed from stands (%s)", step, url)
            return True
        there = bool(trainer.strategy.broadcast(trainer.is_global_zero and store.is_committed(url)))
        if there and trainer.is_global_zero:
            log.warning(
                "nothing trained since step %d, resumed from %s: %s already holds a committed "
                "checkpoint of that step, left as it is",
                step,
                self.resumed_from,
                url,
            )
        return there

    def _retain(self, url: str) -> None:
        """Delete what retention lets go; runs on global rank 0 after each commit of *url* (maybe in the background)."""
        self._stale.discard(url)  # this run's save replaced a stale checkpoint of the same step
        committed, _ = store.scan(self.directory)
        protected = [self.resumed_from] if self.resumed_from else []
        for doomed in store.to_delete(
            committed,
            keep_last=self.block.keep_last,
            keep_best=self.block.keep_best,
            monitor=self.block.monitor,
            mode=self.block.mode,
            protected=protected,
            stale=self._stale,
        ):
            store.remove(doomed)
