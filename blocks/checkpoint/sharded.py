"""Sharded (DCP) checkpoints for FSDP2 through fsspec, with the same commit protocol (imported when building).

Lightning's ``ModelParallelStrategy`` writes distributed checkpoints with local paths only;
this subclass writes the model and optimizer shards with torch distributed checkpoint's
fsspec writer (any URL, ``s3://`` included), the rest of the training state as ``state.pt``
from rank 0, and commits with a manifest once every rank's shards are complete. DCP
reshards on load, so a checkpoint loads on another world size.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from fsspec.core import url_to_fs
from pytorch_lightning.strategies import ModelParallelStrategy
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from blocks.checkpoint import store
from blocks.checkpoint.io import STATE_FILE, FsspecCheckpointIO

SHARDS_DIR = "dcp"


class ShardedCheckpointStrategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` whose checkpoints are DCP shards on any fsspec URL, committed by manifest."""

    def __init__(self, *args: Any, io: FsspecCheckpointIO | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.io = io or FsspecCheckpointIO()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Every rank writes its shards; rank 0 writes the rest and commits after all shards are in."""
        url = str(self.broadcast(str(filepath)))
        fs, root = url_to_fs(url)
        if self.global_rank == 0 and fs.exists(root):
            store.remove(url)
        self.barrier("blocks-sharded-save-start")
        shards = {"model": checkpoint.pop("state_dict")}
        for index, state in enumerate(checkpoint.pop("optimizer_states", [])):
            shards[f"optimizer_{index}"] = state
        dcp.save(shards, storage_writer=FsspecWriter(store.join(url, SHARDS_DIR)))
        self.barrier("blocks-sharded-save-shards")
        if self.global_rank == 0:
            with fs.open(store.join(root, STATE_FILE), "wb") as fh:
                torch.save(checkpoint, fh)
            manifest = self.io.pending_manifest
            assert manifest is not None, "the checkpoint callback sets the manifest before saving"
            store.commit(url, store.Manifest(**{**manifest.__dict__, "sharded": True}))
        self.barrier("blocks-sharded-save-commit")

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Load shards into the sharded model and optimizer (resharding as needed), return the rest."""
        url = str(self.broadcast(str(checkpoint_path)))
        store.verify(url)
        assert self.model is not None
        options = StateDictOptions(full_state_dict=False)
        shards: dict[str, Any] = {"model": get_model_state_dict(self.model, options=options)}
        for index, optimizer in enumerate(self.optimizers):
            shards[f"optimizer_{index}"] = get_optimizer_state_dict(self.model, optimizer, options=options)
        dcp.load(shards, storage_reader=FsspecReader(store.join(url, SHARDS_DIR)))
        set_model_state_dict(self.model, shards["model"], options=options)
        for index, optimizer in enumerate(self.optimizers):
            set_optimizer_state_dict(self.model, optimizer, shards[f"optimizer_{index}"], options=options)
        fs, root = url_to_fs(url)
        with fs.open(store.join(root, STATE_FILE), "rb") as fh:
            return torch.load(fh, map_location="cpu", weights_only=True)
