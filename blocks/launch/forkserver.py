"""The module torchrun's forkserver preloads: the server dies with torchrun, and holds the workers' imports.

torchrun forks its workers from a multiprocessing forkserver (``--start-method=forkserver``)
that imports this module once (``multiprocessing.set_forkserver_preload``), so each worker and
each restart starts with torch, Lightning and blocks already imported.

Importing this module asks the kernel to kill the importing process when its parent dies, so
only the forkserver imports it. The server must not outlive torchrun: every worker holds the
server's "torchrun is alive" pipe open, so the server would not notice torchrun's death, and
the workers, which die with the server, would go on training.

The server ignores SIGTERM, as multiprocessing makes it ignore SIGINT: a SIGTERM sent to every
process of a job (SLURM's scancel or preemption, systemd's control-group stop) would end it, and
the workers with it, while they save their checkpoint. Each worker takes SIGTERM's default
action back (:func:`~blocks.launch.worker.forked_worker`).

The imports run with the garbage collector paused, and what they made is frozen
(:mod:`blocks.launch.collector`; Python's docs advise :func:`gc.freeze` before a fork): the
workers' collections skip the 400 000 objects the imports made instead of walking them again
(and writing to their shared pages).
"""

from __future__ import annotations

import os
import signal

from blocks.launch.collector import collection_paused, own_this_process
from blocks.launch.lifeline import die_with_parent

if not die_with_parent():
    os._exit(1)  # an orphan: the torchrun that started this server is gone

own_this_process()
with collection_paused():
    import blocks.checkpoint.weights
    import blocks.launch.worker
    import blocks.runtime.trainer  # noqa: F401

signal.signal(signal.SIGTERM, signal.SIG_IGN)
