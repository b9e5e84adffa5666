"""Which attempt a worker process is: read once from the launcher's environment, below every layer."""

from __future__ import annotations

import os


def restart_count() -> int:
    """Which attempt this worker process is: torchrun's restart count (0 on the first run and outside torchrun)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0
