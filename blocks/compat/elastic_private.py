"""torchrun's (``torch.distributed.elastic``) internals, imported only by torchrun's own process (:mod:`blocks.launch.torchrun`)."""

from __future__ import annotations

from types import FrameType

import torch.distributed.elastic.multiprocessing.api as elastic_processes

__all__ = ["stop_on_the_first_signal_only"]


def stop_on_the_first_signal_only() -> None:
    """Make torchrun act on its first SIGTERM/SIGINT only: it passes that one to the workers and waits for them.

    torchrun's handler raises ``SignalException`` at every signal; its workers' shutdown
    (passing the signal on, then ``--shutdown-timeout`` seconds for them to end) runs in the
    ``except`` of the first, so a second signal aborts it and torchrun exits at once, and its
    workers die with it, before they saved. A job signalled as a whole (SLURM, systemd, ``kill
    -- -PGID`` for every group) sends torchrun two: its own, and the one ``blocks run`` passes on. A signal
    after the first is dropped here; ``blocks run`` ends torchrun with SIGKILL on a second one
    of its own.
    """
    first = elastic_processes._terminate_process_handler
    if getattr(first, "blocks_once", False):
        return
    received: list[int] = []

    def once(signum: int, frame: FrameType | None) -> None:
        if not received:
            received.append(signum)
            first(signum, frame)

    once.blocks_once = True  # type: ignore[attr-defined]
    # PContext.start installs the module's handler by name, at every start of the workers
    elastic_processes._terminate_process_handler = once
