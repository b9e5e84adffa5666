"""Processes that die with the process that started them (Linux), so no worker outlives its job.

torchrun starts each worker in a session of its own, so killing the ``blocks run`` process
group (or torchrun alone) with SIGKILL would leave the workers training. The driver names
itself in ``$BLOCKS_PARENT_PID`` for torchrun, torchrun names itself for the workers, and
each asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "BLOCKS_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """Get SIGKILL when the parent named in ``$BLOCKS_PARENT_PID`` dies; False when it is already gone.

    Does nothing without the variable (workers started by srun or mpirun) or off Linux. The
    process entry points that call it end the process at once on False: an orphan must not
    start training.
    """
    expected = os.environ.get(PARENT_ENV)
    if not expected or not sys.platform.startswith("linux"):
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    return os.getppid() == int(expected)  # else the parent died before the request took effect


def children_environment(environ: dict[str, str]) -> dict[str, str]:
    """*environ* naming this process as the parent its children must die with."""
    return {**environ, PARENT_ENV: str(os.getpid())}
