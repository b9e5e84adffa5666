"""Export a committed checkpoint's model weights as one safetensors file, without ``blocks`` training code."""

from __future__ import annotations

from pathlib import Path

import torch

from blocks.checkpoint import store
from blocks.checkpoint.io import load_state
from blocks.checkpoint.weights import save_weights

MODEL_PREFIX = "model."


def checkpoint_weights(url: str) -> dict[str, torch.Tensor]:
    """The model's full (consolidated) weights in a committed checkpoint, sharded or not.

    Runs in one process without a process group: DCP shards are read and stitched together.
    """
    manifest = store.verify(url)
    if manifest.sharded:
        from blocks.checkpoint.safe_dcp import SafeFsspecReader, check_sharded
        from blocks.compat.dcp_private import dcp_load_everything

        check_sharded(url, manifest)
        state = dcp_load_everything(SafeFsspecReader(store.join(url, store.SHARDS_DIR)))["model"]
    else:
        state = load_state(url)["state_dict"]
    return {
        name[len(MODEL_PREFIX) :]: tensor
        for name, tensor in state.items()
        if name.startswith(MODEL_PREFIX) and isinstance(tensor, torch.Tensor)
    }


def export_checkpoint(url: str, out: Path) -> Path:
    """Write the model weights of the checkpoint at *url* to *out* (safetensors)."""
    save_weights(checkpoint_weights(url), out)
    return out
