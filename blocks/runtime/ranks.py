"""Per-rank state in a checkpoint: gathered from every rank when saved, each rank's own when restored."""

from __future__ import annotations

from typing import Any


def every_rank(value: Any) -> list[Any]:
    """*value* of every rank, in rank order (a collective: every rank must call it); ``[value]`` alone."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def rank_and_world() -> tuple[int, int]:
    """The global rank of the calling process and the world size (``(0, 1)`` without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()
