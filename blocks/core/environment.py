"""What the planning machine can see of its hardware, without importing torch; and which torchrun attempt a worker is."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blocks.spec.restarts import restart_count as restart_count

_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


@dataclass(frozen=True)
class Environment:
    """Hardware facts the plan resolves ``auto`` settings and its memory budget against.

    Attributes:
        gpus: NVIDIA GPUs visible to this process (honours ``CUDA_VISIBLE_DEVICES``).
        gpu_memory_bytes: memory of the smallest visible GPU; None when unknown.
        host_memory_bytes: physical memory of this machine; None when unknown.
    """

    gpus: int = 0
    gpu_memory_bytes: int | None = None
    host_memory_bytes: int | None = None

    @classmethod
    def detect(cls) -> Environment:
        """Count GPUs from the driver's ``/proc`` entries (0 without an NVIDIA driver) and read memory sizes."""
        try:
            present = sum(1 for _ in _NVIDIA_GPUS.iterdir())
        except OSError:
            present = 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
            present = min(present, len(ids))
        return cls(
            gpus=present,
            gpu_memory_bytes=_gpu_memory_bytes() if present else None,
            host_memory_bytes=_host_memory_bytes(),
        )

    def to_json(self) -> dict[str, int | None]:
        """A JSON-ready view (``plan.json``'s ``environment``: what the driver planned against)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Environment:
        """The environment a frozen ``plan.json`` recorded (unknown keys from newer versions are ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def resolve_accelerator(self, requested: str) -> str:
        """``auto`` becomes ``gpu`` when a GPU is visible, else ``cpu``; others stay as they are."""
        if requested == "auto":
            return "gpu" if self.gpus else "cpu"
        return requested


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@functools.lru_cache(maxsize=1)
def _gpu_memory_bytes() -> int | None:
    """The smallest visible GPU's total memory, from ``nvidia-smi`` (None when it cannot say)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
        sizes = [int(line.strip()) for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(sizes) * 2**20 if sizes else None
