"""Final weights: a consolidated state dict, its ``state_digest``, and ``model.safetensors``."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import nn


def is_sharded(module: nn.Module) -> bool:
    """Whether FSDP2 has sharded any part of *module*."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules())


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded CPU state dict with plain parameter names.

    Under FSDP2 this is a collective (every rank must call it) and only global rank 0 gets
    the tensors; other ranks get an empty dict.
    """
    if is_sharded(module):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}
    return {name: tensor.detach().cpu() for name, tensor in module.state_dict().items()}


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 of a state dict's tensors in name order, each as contiguous CPU bytes."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def save_weights(
    state: dict[str, torch.Tensor],
    path: Path,
    step: int | None = None,
    samples: dict[str, str] | None = None,
) -> None:
    """Write *state* as safetensors at the local *path* (shared tensors, like tied embeddings, are stored once each).

    *step*, the optimizer step the weights were taken after, goes into the file's metadata
    (``step``): a reader tells them from a newer checkpoint of the same run dir by it. So do
    *samples*, the digests of what decided the samples they were trained on
    (:func:`blocks.checkpoint.resume.sample_digests`, as JSON under ``samples``): eval refuses
    to score them on a split that holds some of those samples.

    Atomic: written beside *path*, then renamed over it, so a reader (or a crash) never finds
    half a file and a failed write leaves what was there. Written through Python's ``open`` so
    the file's mode follows the umask like every other file blocks writes
    (``safetensors.torch.save_file`` creates it 0600). The same weights and metadata give the
    same bytes.
    """
    from safetensors.torch import save

    metadata = {} if step is None else {"step": str(step)}
    if samples is not None:
        metadata["samples"] = json.dumps(samples, sort_keys=True)
    data = _with_metadata(
        save({name: tensor.detach().cpu().contiguous().clone() for name, tensor in state.items()}), metadata
    )
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _with_metadata(data: bytes, metadata: dict[str, str]) -> bytes:
    """Safetensors *data* with *metadata* in its header, its keys sorted.

    safetensors writes a metadata mapping in hash order, which differs from process to process.
    The header is JSON behind its length; the tensors' offsets count from its end, and it is
    padded with spaces to 8 bytes, as safetensors pads it.
    """
    if not metadata:
        return data
    size = int.from_bytes(data[:8], "little")
    header = {"__metadata__": dict(sorted(metadata.items())), **json.loads(data[8 : 8 + size])}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + size :]
