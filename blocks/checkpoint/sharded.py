"""Sharded (DCP) checkpoints for FSDP2 through fsspec, with the same commit protocol (imported when building).

Lightning's ``ModelParallelStrategy`` writes distributed checkpoints with local paths only;
this subclass writes the model and optimizer shards with torch distributed checkpoint's
fsspec writer (any URL, ``s3://`` included), the rest of the training state as ``state.pt``
from rank 0, and commits with a manifest once every rank's shards are complete. DCP
reshards on load, so a checkpoint loads on another world size.

Rank 0 also writes the non-sharded rest of the training state; ``async_save`` makes both
writes background work (see :meth:`ShardedCheckpointStrategy.save_checkpoint`).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from pytorch_lightning.strategies import ModelParallelStrategy
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from blocks.checkpoint import store
from blocks.checkpoint.io import STATE_FILE, FsspecCheckpointIO, load_state, write_state
from blocks.checkpoint.safe_dcp import SafeFsspecReader, check_sharded
from blocks.checkpoint.storage import storage_errors
from blocks.compat.dcp_private import FsspecWriter


class ShardedCheckpointStrategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` whose checkpoints are DCP shards on any fsspec URL, committed by manifest."""

    def __init__(self, *args: Any, io: FsspecCheckpointIO | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.io = io or FsspecCheckpointIO()

    def setup_environment(self) -> None:
        """Also create the process group that background (async) saves coordinate over."""
        super().setup_environment()
        if self.io.saver is not None:
            # DCP's async save runs collectives from a worker thread; on the training group they
            # could interleave with FSDP's own collectives in a different order on each rank.
            self._save_group = dist.new_group(backend="gloo")

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Every rank writes its shards; rank 0 writes the rest and commits after all shards are in.

        With ``async_save`` DCP copies the shards to host memory and writes them in the
        background; rank 0 commits when DCP's save (which finishes only after every rank's
        shards are written) completes.
        """
        url = str(self.broadcast(str(filepath)))
        self.io.wait()
        if self.global_rank == 0:
            with storage_errors(url):
                store.replace_ours(url, stale=self.io.stale(url))
                store.begin(url)
        self.barrier("blocks-sharded-save-start")
        shards = {"model": checkpoint.pop("state_dict")}
        for index, state in enumerate(checkpoint.pop("optimizer_states", [])):
            shards[f"optimizer_{index}"] = state
        manifest = self.io.pending_manifest
        assert manifest is not None, "the checkpoint callback sets the manifest before saving"
        writer = FsspecWriter(store.join(url, store.SHARDS_DIR))
        beside = dict(self.io.beside)

        def commit() -> None:
            if self.global_rank == 0:
                with storage_errors(url):
                    digest = write_state(url, rest)
                    store.write_beside(url, beside)
                    store.commit(url, replace(manifest, sharded=True), known={STATE_FILE: digest})
                self.io.after_commit(url)

        if self.io.saver is None:
            rest = checkpoint
            with storage_errors(url):
                dcp.save(shards, storage_writer=writer)
            self.barrier("blocks-sharded-save-shards")
            commit()
            self.barrier("blocks-sharded-save-commit")
            return
        rest = self.io.stager.stage(checkpoint)
        written = dcp.async_save(shards, storage_writer=writer, process_group=self._save_group)
        assert isinstance(written, Future)

        def finish() -> None:
            written.result()
            commit()

        self.io.run(finish)

    def teardown(self) -> None:
        """Finish a save in flight (Lightning's ``ModelParallelStrategy`` does not tear its checkpoint IO down)."""
        self.io.teardown()
        super().teardown()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Load shards into the sharded model and optimizer (resharding as needed), return the rest."""
        url = str(self.broadcast(str(checkpoint_path)))
        check_sharded(url, store.verify(url))
        assert self.model is not None
        options = StateDictOptions(full_state_dict=False)
        shards: dict[str, Any] = {"model": get_model_state_dict(self.model, options=options)}
        for index, optimizer in enumerate(self.optimizers):
            shards[f"optimizer_{index}"] = get_optimizer_state_dict(self.model, optimizer, options=options)
        dcp.load(shards, storage_reader=SafeFsspecReader(store.join(url, store.SHARDS_DIR)))
        set_model_state_dict(self.model, shards["model"], options=options)
        for index, optimizer in enumerate(self.optimizers):
            set_optimizer_state_dict(self.model, optimizer, shards[f"optimizer_{index}"], options=options)
        return load_state(url)
