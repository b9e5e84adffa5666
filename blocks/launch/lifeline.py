"""Processes that die with the process that started them (Linux), so no worker outlives its job.

torchrun starts each worker in a session of its own, so killing the ``blocks run`` process
group (or torchrun alone) with SIGKILL would leave the workers training. The driver names
itself in ``$BLOCKS_PARENT_PID`` for torchrun, torchrun names itself for its forkserver and
workers, and each asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``):
driver, torchrun, forkserver, worker.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "BLOCKS_PARENT_PID"
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_ON_LINUX = sys.platform.startswith("linux")

WORKER_NAME = "blocks-rank"
"""The process name (``ps -o comm``) of a worker torchrun forked, followed by its global rank."""


def die_with_parent(*, forked_by_server: bool = False) -> bool:
    """Get SIGKILL when the parent named in ``$BLOCKS_PARENT_PID`` dies; False when it is already gone.

    Does nothing without the variable (workers started by srun or mpirun) or off Linux. The
    process entry points that call it end the process at once on False: an orphan must not
    start training.

    A worker *forked_by_server* is the child of a multiprocessing forkserver, which the named
    process started and which exits when that process dies: the worker dies with the forkserver,
    and the named process must be the forkserver's parent.
    """
    expected = os.environ.get(PARENT_ENV)
    if not expected or not _ON_LINUX:
        return True
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    parent = os.getppid()
    if forked_by_server:
        parent = _parent_of(parent)
    return parent == int(expected)  # else the parent died before the request took effect


def _parent_of(pid: int) -> int:
    """The parent process id of *pid* (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def children_environment(environ: dict[str, str]) -> dict[str, str]:
    """*environ* naming this process as the parent its children must die with."""
    return {**environ, PARENT_ENV: str(os.getpid())}


def name_process(name: str) -> None:
    """Name this process for ``ps -o comm``, ``top`` and ``/proc/PID/comm`` (Linux keeps 15 bytes).

    Workers forked from a forkserver share its command line; the name tells their ranks apart.
    """
    if _ON_LINUX:
        _prctl(_PR_SET_NAME, name.encode()[:15])


def _prctl(option: int, argument: int | bytes) -> None:
    """``prctl(option, argument)`` of this process (Linux)."""
    ctypes.CDLL(None).prctl(option, argument, 0, 0, 0)
