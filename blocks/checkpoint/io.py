"""Lightning ``CheckpointIO`` that writes committed checkpoints to any fsspec URL (imported when building).

Lightning hands over the checkpoint dict (model, optimizer and scheduler states, loop
progress, callback states); this plugin writes it as ``state.pt`` into the checkpoint's
directory, hashing the bytes as they are written (one pass), then commits it with a
manifest. Loading uses ``torch.load(weights_only=True)`` (checkpoints hold tensors and plain
data, never code) with the file hashed beside it (a local file) or as it is downloaded, once,
into memory (an object store); the state is handed over only once it matches the manifest. A
resume from an object store loads the state while verifying it and its load takes that state
(:func:`~blocks.checkpoint.store.keeping`): one download per process.

With ``async_save`` the training thread only copies the state into host memory; writing,
hashing and committing run on a :class:`~blocks.checkpoint.background.BackgroundSaver`.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from collections.abc import Callable
from typing import Any, BinaryIO

import torch
from fsspec.core import url_to_fs
from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection

from blocks.checkpoint import store
from blocks.checkpoint.background import BackgroundSaver
from blocks.checkpoint.storage import storage_errors
from blocks.compat.torch_private import save_without_zip_crc
from blocks.spec.restarts import restart_count

log = logging.getLogger(__name__)

STATE_FILE = store.STATE_FILE
SLOW_SAVE_ENV = "BLOCKS_FAULT_SLOW_SAVE"
"""Fault-injection hook for tests: ``STEP:SECONDS`` makes the save of the checkpoint of optimizer step STEP
sleep SECONDS before it writes ``state.pt`` (on the thread that writes: the background one with
``checkpoint.async_save``), in the first attempt only."""


class UnsafeCheckpointError(store.CheckpointError):
    """The checkpoint carries pickled objects that ``weights_only`` loading refuses to execute."""


class HostStager:
    """Copies a checkpoint's tensors into host memory, reusing the buffers of the previous save.

    Reuse makes every save after the first a plain copy into memory that is already mapped
    (and pinned, for CUDA tensors), the cheapest snapshot there is. The caller must not stage
    again while a previous snapshot is still being written. Tensors shared under several names
    (tied weights) stay shared in the snapshot.

    The copies run with one intra-op thread: a memory copy gains nothing from more, and on a
    host with more busy threads than cores torch's thread pool made a 36 MB copy ten times
    slower (every parallel copy waits for its slowest, descheduled thread).
    """

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []

    def stage(self, state: Any) -> Any:
        """A copy of *state* with every tensor in host memory (containers copied too)."""
        position = 0
        staged: dict[int, torch.Tensor] = {}
        from_cuda = False

        def copy(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal position, from_cuda
            source = tensor.detach()
            if id(tensor) in staged:
                return staged[id(tensor)]
            if position == len(self._buffers):
                self._buffers.append(torch.empty(0))
            buffer = self._buffers[position]
            if buffer.shape != source.shape or buffer.dtype != source.dtype:
                buffer = torch.empty(source.shape, dtype=source.dtype, pin_memory=source.is_cuda)
                self._buffers[position] = buffer
            buffer.copy_(source, non_blocking=source.is_cuda)
            from_cuda |= source.is_cuda
            position += 1
            staged[id(tensor)] = buffer
            return buffer

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            snapshot = apply_to_collection(state, torch.Tensor, copy)
        finally:
            torch.set_num_threads(threads)
        if from_cuda:
            torch.cuda.synchronize()
        return snapshot


def _injected_delay(step: int) -> None:
    """Sleep as :data:`SLOW_SAVE_ENV` says for the save of *step* (no-op without it)."""
    value = os.environ.get(SLOW_SAVE_ENV)
    if not value or restart_count():
        return
    at, seconds = value.split(":")
    if int(at) == step:
        log.warning("%s: the save of step %d sleeps %ss", SLOW_SAVE_ENV, step, seconds)
        time.sleep(float(seconds))


def write_state(url: str, state: dict[str, Any]) -> tuple[int, str]:
    """Write *state* as ``<url>/state.pt``; returns its size and digest (:data:`store.HASH`), computed while writing.

    The file is ``torch.save``'s format without the zip CRC32 of each record: the manifest's
    digest covers every byte, so the CRC pass (a fifth of a save's time) would check nothing more.
    """
    fs, root = url_to_fs(url)
    with fs.open(store.join(root, STATE_FILE), "wb") as fh:
        writer = store.HashingWriter(fh)
        save_without_zip_crc(state, writer)  # type: ignore[arg-type]  # a file-like object with write()
    return writer.digest


class FsspecCheckpointIO(CheckpointIO):
    """Save to and load from ``<url>/state.pt`` with a manifest, on any fsspec file system.

    Args:
        async_save: write and commit on a background thread after a copy to host memory.

    Attributes:
        pending_manifest: set by the checkpoint callback before each save.
        beside: small text files (name → content) written into each checkpoint with its state
            (:data:`~blocks.checkpoint.store.PACKAGES_FILE`), which its commit lists and digests.
        after_commit: called with the URL once a checkpoint is committed (retention runs here).
        stale: whether the committed checkpoint at a URL may be replaced by a save of its step
            (one a longer earlier run left; see :func:`blocks.checkpoint.store.replace_ours`).
    """

    def __init__(self, *, async_save: bool = False) -> None:
        self.pending_manifest: store.Manifest | None = None
        self.beside: dict[str, str] = {}
        self.after_commit: Callable[[str], None] = lambda url: None
        self.stale: Callable[[str], bool] = lambda url: False
        self.saver = BackgroundSaver() if async_save else None
        self.stager = HostStager()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Write ``state.pt`` (rank 0 only, Lightning's call) and commit it with the pending manifest."""
        url = str(path)
        manifest = self.pending_manifest
        assert manifest is not None, "the checkpoint callback sets the manifest before saving"
        beside = dict(self.beside)

        def write_and_commit(state: dict[str, Any]) -> None:
            with storage_errors(url):
                store.replace_ours(url, stale=self.stale(url))  # a leftover of the same step
                store.begin(url)
                _injected_delay(manifest.step)
                digest = write_state(url, state)
                store.write_beside(url, beside)
                store.commit(url, manifest, known={STATE_FILE: digest})
            self.after_commit(url)

        self.wait()  # the previous snapshot's memory is free again before this one is taken
        state = self.stager.stage(checkpoint) if self.saver else checkpoint
        self.run(lambda: write_and_commit(state))

    def run(self, save: Callable[[], None]) -> None:
        """Run *save* now, or (async) wait for the previous save and start *save* in the background.

        With async saving, *save* must only touch host copies taken before this call.
        """
        if self.saver is None:
            save()
        else:
            self.saver.submit(save)

    def wait(self) -> None:
        """Block until the save in flight is committed (no-op when saving synchronously)."""
        if self.saver is not None:
            self.saver.wait()

    def teardown(self) -> None:
        """Finish the save in flight before the process moves on (or exits)."""
        if self.saver is not None:
            self.saver.close()

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = True
    ) -> dict[str, Any]:
        """Load the checkpoint with ``weights_only=True``, verified against its manifest while it loads.

        The state the resume's checks loaded from an object store (:func:`store.keeping`) is
        taken instead of a second download, when its files are unchanged since.
        """
        url = str(path)
        kept = _kept(url, map_location, take=True)
        if kept is not None:
            return kept
        return store.load_verified(url, lambda fh: _load(fh, url, map_location))

    def remove_checkpoint(self, path: Any) -> None:
        """Delete the checkpoint directory."""
        store.remove(str(path))


def load_state(url: str, map_location: Any | None = None, *, mmap: bool = False) -> dict[str, Any]:
    """The ``state.pt`` of checkpoint *url*, loaded with ``weights_only=True``: the one loader of every full state.

    A state that holds pickled objects other than tensors and plain data is refused with
    :class:`UnsafeCheckpointError` (sharded shards go through :mod:`blocks.checkpoint.safe_dcp`).
    *mmap* maps a local file's tensors instead of reading them (to check a state cheaply).
    From an object store, the state a resume kept (:func:`store.keeping`) is read instead of
    the store; without *mmap* the caller is its last reader and takes it.
    """
    fs, root = url_to_fs(url)
    path = store.join(root, STATE_FILE)
    if mmap and "file" in fs.protocol:
        return _load(path, url, "cpu", mmap=True)
    kept = _kept(url, "cpu" if mmap else map_location, take=not mmap)
    if kept is not None:
        return kept
    with fs.open(path, "rb") as fh:
        return _load(fh, url, map_location)


def load_state_file(source: str | BinaryIO, url: str) -> dict[str, Any]:
    """The state in ``state.pt`` of checkpoint *url*, loaded onto the CPU as :func:`load_state` loads it.

    *source* is a local copy's path (mapped, not read) or an open file. The loader a resume
    verifies an object store's ``state.pt`` with (:func:`store.keeping`).
    """
    return _load(source, url, "cpu", mmap=isinstance(source, str))


def _kept(url: str, map_location: Any | None, *, take: bool) -> dict[str, Any] | None:
    """The state of checkpoint *url* a resume kept (:func:`store.kept_state`), when it is what *map_location* asks for (the CPU)."""
    state = store.kept_state(url, take=take)
    return state if map_location in (None, "cpu") else None


def _load(source: Any, url: str, map_location: Any | None, *, mmap: bool = False) -> dict[str, Any]:
    try:
        state: dict[str, Any] = torch.load(
            source, map_location=map_location or "cpu", weights_only=True, mmap=True if mmap else None
        )
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"{url} holds pickled objects that are not tensors or plain data; refusing to load it "
            f"({str(exc).splitlines()[0]})"
        ) from None
    return state
