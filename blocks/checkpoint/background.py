"""One checkpoint write at a time, off the training thread (torch-free).

``checkpoint.async_save=true`` snapshots the training state into host memory on the training
thread, then hands the write and the commit to this saver. Before a new save starts, the
previous one must have finished, so at most one save is in flight and host memory holds at
most one snapshot. An error in a background save is raised on the training thread at the
next save or when training ends, never lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)


class BackgroundSaver:
    """Runs save jobs on one worker thread, one at a time, and reports their errors."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: Future[None] | None = None

    @property
    def busy(self) -> bool:
        """Whether a save is still running."""
        return self._inflight is not None and not self._inflight.done()

    def submit(self, job: Callable[[], None]) -> None:
        """Wait for the previous save (raising its error), then start *job* in the background."""
        self.wait()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blocks-checkpoint")
        self._inflight = self._executor.submit(job)

    def wait(self) -> None:
        """Block until the save in flight (if any) is done; re-raise what it raised."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def close(self) -> None:
        """Finish the save in flight and stop the worker thread."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
