"""What the planning machine can see of its hardware, without importing torch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


@dataclass(frozen=True)
class Environment:
    """Hardware facts the plan resolves ``auto`` settings against.

    Attributes:
        gpus: NVIDIA GPUs visible to this process (honours ``CUDA_VISIBLE_DEVICES``).
    """

    gpus: int = 0

    @classmethod
    def detect(cls) -> Environment:
        """Count GPUs from the driver's ``/proc`` entries; 0 when there is no NVIDIA driver."""
        try:
            present = sum(1 for _ in _NVIDIA_GPUS.iterdir())
        except OSError:
            present = 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
            present = min(present, len(ids))
        return cls(gpus=present)

    def resolve_accelerator(self, requested: str) -> str:
        """``auto`` becomes ``gpu`` when a GPU is visible, else ``cpu``; others stay as they are."""
        if requested == "auto":
            return "gpu" if self.gpus else "cpu"
        return requested
