"""``state_digest``: a fingerprint of model weights for comparing runs bit for bit."""

from __future__ import annotations

import hashlib

import torch


def state_digest(module: torch.nn.Module) -> str:
    """sha256 of parameters and buffers in name order, each as contiguous CPU bytes."""
    digest = hashlib.sha256()
    state = module.state_dict()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
