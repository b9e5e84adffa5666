"""One job at a time per run dir: a lock file with the holder's host, pid and a heartbeat.

``blocks run`` takes the lock before it writes anything into the run dir and gives it back
at the end. A second job into a held run dir is refused, naming the holder. A lock whose
holder is gone (a dead pid on this host, or a heartbeat older than :data:`STALE_AFTER_S` from
another host) is taken over with a warning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from blocks.spec.errors import BlocksError, Problem

LOCK_FILE = ".blocks.lock"
HEARTBEAT_S = 10.0
"""How often the holder refreshes the heartbeat."""
STALE_AFTER_S = 120.0
"""A lock not refreshed for this long is stale, whatever host holds it."""

log = logging.getLogger(__name__)


class RunDirBusy(BlocksError):
    """Another live job holds the run dir."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def holder_is_alive(holder: dict[str, Any], now: float | None = None) -> bool:
    """Whether the job described by a lock file's content still holds its run dir."""
    now = time.time() if now is None else now
    try:
        heartbeat = float(holder["heartbeat"])
        pid = int(holder["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    if now - heartbeat > STALE_AFTER_S:
        return False
    if holder.get("host") == socket.gethostname():
        return _pid_alive(pid)
    return True


class RunDirLock:
    """The lock on one run dir, held by this process until :meth:`release`."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._content = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "heartbeat": time.time(),
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`RunDirBusy` naming the live holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _read(self.path)
                if holder is not None and holder_is_alive(holder):
                    raise RunDirBusy(
                        Problem(
                            "hydra.run.dir",
                            f"{self.path.parent} is in use by another job: pid {holder.get('pid')} on host "
                            f"{holder.get('host')}, started {holder.get('started')}",
                            "wait for that job to end or stop it, or choose another hydra.run.dir; a lock "
                            f"whose holder died is taken over automatically (remove {self.path} only if "
                            "you are sure no job uses the dir)",
                        )
                    ) from None
                log.warning(
                    "taking over the stale lock %s (holder %s)",
                    self.path,
                    "unreadable" if holder is None else f"pid {holder.get('pid')} on {holder.get('host')}",
                )
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump(self._content, fh)
            break
        else:  # pragma: no cover - three live races in a row
            raise RunDirBusy(Problem("hydra.run.dir", f"could not lock {self.path}", "retry"))
        self._thread = threading.Thread(target=self._beat, name="blocks-run-dir-lock", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self._content["heartbeat"] = time.time()
            tmp = self.path.with_name(f"{LOCK_FILE}.{os.getpid()}.tmp")
            with contextlib.suppress(OSError):
                tmp.write_text(json.dumps(self._content))
                tmp.replace(self.path)

    def release(self) -> None:
        """Stop the heartbeat and remove the lock file (when it is still ours)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        holder = _read(self.path)
        if (
            holder is not None
            and holder.get("pid") == os.getpid()
            and holder.get("host") == socket.gethostname()
        ):
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


@contextlib.contextmanager
def locked(run_dir: Path) -> Iterator[RunDirLock]:
    """Hold the lock on *run_dir* for the duration of the block."""
    lock = RunDirLock(run_dir)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
