"""Python's garbage collector around a training process's imports and its exit.

Importing torch and Lightning makes over 400 000 objects that the collector tracks and that
live as long as the process. While they are made, the collector's full collections walk all of
them again and again (seven times, about 0.75 s on a 2-core machine), and at exit Python's last
collections walk them once more (about a second). Neither frees anything.

- :func:`collection_paused` pauses the collector around those imports; in a process that
  ``blocks`` started (:func:`own_this_process`), it then freezes what exists (:func:`gc.freeze`),
  so that no later collection walks it, in that process or in the processes forked from it.
  Only imports that happened are frozen: a sweep's later jobs import nothing new, and what the
  earlier jobs left for the collector (a trainer and its model, in reference cycles) must stay
  collectable.
- :func:`skip_final_collection` freezes everything as a process's entry point ends.
- :func:`collect_earlier_jobs` collects, before a job of a sweep or a pipeline trains, what the
  jobs before it in the process left.

A program that calls ``blocks`` in its own process (tests, notebooks) keeps its collector: the
pause ends with the imports, and nothing of its heap is frozen.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator

_owned = False


def own_this_process() -> None:
    """Say that ``blocks`` started this process (called by the process entry points only): its heap may be frozen."""
    global _owned
    _owned = True


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Pause the garbage collector while the block imports torch and Lightning; freeze the result in our own process.

    Collections during the imports only walk objects that stay alive. The collector is
    enabled again afterwards if it was before; reference counting frees memory meanwhile, as
    always. Nothing is frozen when the block imported nothing (the modules were imported before).
    """
    enabled = gc.isenabled()
    imported = len(sys.modules)
    gc.disable()
    try:
        yield
    finally:
        if _owned and len(sys.modules) > imported:
            gc.freeze()
        if enabled:
            gc.enable()


def skip_final_collection() -> None:
    """Let this process exit without walking every object it holds: call it as the entry point ends.

    At exit Python garbage-collects whatever is still alive; after torch and Lightning were
    imported that is over 400 000 objects, about a second of CPU (half a second for torch
    alone) spent freeing memory the kernel frees anyway. Frozen objects (:func:`gc.freeze`)
    are left out of it; atexit handlers, the flush of open files and streams, and objects
    freed by reference counting as modules are torn down all happen as before.
    """
    gc.freeze()


def collect_earlier_jobs() -> None:
    """Free what earlier jobs in this process left before the next one trains (a sweep's or a pipeline's jobs).

    A finished job's trainer, model and optimizer hold each other in reference cycles, which
    only a collection frees; until then their tensors stay resident, beside the next job's,
    and in its ``peak_memory_mb``. One full collection, about 0.2 s.
    """
    gc.collect()
