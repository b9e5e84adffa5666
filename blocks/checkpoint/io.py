"""Lightning ``CheckpointIO`` that writes committed checkpoints to any fsspec URL (imported when building).

Lightning hands over the checkpoint dict (model, optimizer and scheduler states, loop
progress, callback states); this plugin writes it as ``state.pt`` into the checkpoint's
directory, then commits it with a manifest. Loading verifies the manifest and uses
``torch.load(weights_only=True)``: checkpoints hold tensors and plain data, never code.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
from fsspec.core import url_to_fs
from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO

from blocks.checkpoint import store

STATE_FILE = "state.pt"


class UnsafeCheckpointError(store.CheckpointError):
    """The checkpoint carries pickled objects that ``weights_only`` loading refuses to execute."""


class FsspecCheckpointIO(CheckpointIO):
    """Save to and load from ``<url>/state.pt`` with a manifest, on any fsspec file system."""

    def __init__(self) -> None:
        self.pending_manifest: store.Manifest | None = None

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Write ``state.pt`` (rank 0 only, Lightning's call) and commit it with the pending manifest."""
        url = str(path)
        fs, root = url_to_fs(url)
        if fs.exists(root):
            store.remove(url)  # an uncommitted leftover of the same step
        fs.makedirs(root, exist_ok=True)
        with fs.open(store.join(root, STATE_FILE), "wb") as fh:
            torch.save(checkpoint, fh)
        assert self.pending_manifest is not None, "the checkpoint callback sets the manifest before saving"
        store.commit(url, self.pending_manifest)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = True
    ) -> dict[str, Any]:
        """Verify the checkpoint and load it with ``weights_only=True``."""
        url = str(path)
        store.verify(url)
        fs, root = url_to_fs(url)
        with fs.open(store.join(root, STATE_FILE), "rb") as fh:
            try:
                return torch.load(fh, map_location=map_location or "cpu", weights_only=True)
            except pickle.UnpicklingError as exc:
                raise UnsafeCheckpointError(
                    f"{url} holds pickled objects that are not tensors or plain data; refusing to load it "
                    f"({str(exc).splitlines()[0]})"
                ) from None

    def remove_checkpoint(self, path: Any) -> None:
        """Delete the checkpoint directory."""
        store.remove(str(path))
