"""One job at a time per directory: a lock file with the holder's host, pid and a heartbeat.

``blocks run`` locks its run dir before it writes anything there, and its checkpoint dir (its
own lock file, :data:`CHECKPOINT_LOCK_FILE`, also in the default ``checkpoints/`` of the run dir,
so that a job whose ``checkpoint.dir`` is another run's ``checkpoints/`` meets that run's lock
in either order); it gives both back at the end. A second job into a
held directory is refused, naming the holder. A lock whose holder is gone (a dead pid on this
host, or a heartbeat older than :data:`STALE_AFTER_S` from any host) is taken over with a warning.

The drivers of one multi-node job (one ``blocks run`` per node, started with torchrun's
rendezvous) share the locks: each lock names its *job* and lists its *members*, and a driver of
the job that holds a directory joins it (adds itself) instead of being refused. Every member
refreshes its own heartbeat; one that ends removes itself, and the last one removes the lock, so
the directory stays held while any node's driver runs, whichever started first. A member that
died (a dead pid on this host, or no heartbeat for :data:`STALE_AFTER_S`) is dropped by the
others; a job of any other kind, or another multi-node job, is refused as before. Members update
the lock by reading and rewriting it: two that do so at the same instant can drop one's entry,
which that member writes back at its next heartbeat (and a lock removed meanwhile is recreated).

A local directory is locked by creating its lock file with ``O_EXCL``: of two jobs, exactly one
gets it. A directory in an object store (``s3://...``, any fsspec URL) has no atomic
create-if-absent in general, so the lock is a best effort: the object is written when absent
and read back after :data:`REMOTE_SETTLE_S`; a job that finds another's live lock, there or in
the read-back, is refused. That refuses every job that starts while another holds the
directory; two jobs whose attempts fall within the same second can both believe they hold it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from blocks.checkpoint.storage import unwritable
from blocks.spec.errors import BlocksError, Problem

LOCK_FILE = ".blocks.lock"
CHECKPOINT_LOCK_FILE = ".blocks-checkpoints.lock"
HEARTBEAT_S = 10.0
"""How often the holder refreshes the heartbeat."""
STALE_AFTER_S = 120.0
"""A lock not refreshed for this long is stale, whatever host holds it."""
REMOTE_SETTLE_S = 1.0
"""How long a remote lock waits after writing before reading it back to see whether it won."""

RUN_DIR_FIX = (
    "wait for that job to end or stop it, or choose another hydra.run.dir; a lock whose holder "
    "died is taken over automatically (remove {lock} only if you are sure no job uses the dir)"
)
CHECKPOINT_DIR_FIX = (
    "choose another checkpoint.dir, or wait for that job to end or stop it (checkpoint.resume=auto "
    "then continues from its checkpoints); a lock whose holder died is taken over automatically "
    "(remove {lock} only if you are sure no job uses the dir)"
)

log = logging.getLogger(__name__)


class DirBusy(BlocksError):
    """Another live job holds the directory."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parse(text: str | bytes | None) -> dict[str, Any] | None:
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _entry_alive(entry: dict[str, Any], now: float) -> bool:
    """Whether the process an entry names (host, pid, heartbeat) is alive."""
    try:
        heartbeat = float(entry["heartbeat"])
        pid = int(entry["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    if now - heartbeat > STALE_AFTER_S:
        return False
    if entry.get("host") == socket.gethostname():
        return _pid_alive(pid)
    return True


def members(holder: dict[str, Any]) -> list[dict[str, Any]]:
    """The drivers that share a lock: its ``members``, else (a lock of one job) its holder."""
    listed = holder.get("members")
    if isinstance(listed, list):
        return [m for m in listed if isinstance(m, dict)]
    return [{k: holder.get(k) for k in ("host", "pid", "token", "heartbeat")}]


def live_members(holder: dict[str, Any], now: float | None = None) -> list[dict[str, Any]]:
    """The members of a lock (:func:`members`) that are still alive."""
    now = time.time() if now is None else now
    return [m for m in members(holder) if _entry_alive(m, now)]


def holder_is_alive(holder: dict[str, Any], now: float | None = None) -> bool:
    """Whether the job described by a lock file's content still holds its directory (any member is alive)."""
    return bool(live_members(holder, now))


class LockFile(Protocol):
    """Where a lock's content lives, and the few operations the lock needs on it."""

    location: str

    def create(self, text: str) -> bool:
        """Write *text* unless a lock is there already; whether this call's lock is the one there now."""

    def read(self) -> dict[str, Any] | None:
        """The lock's content, None when there is none or it is unreadable."""

    def replace(self, text: str) -> None:
        """Overwrite the lock with *text* (a heartbeat)."""

    def remove(self) -> None:
        """Delete the lock (gone already is fine)."""


class LocalLockFile:
    """A lock file on a local file system: created atomically with ``O_EXCL``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = str(path)

    def create(self, text: str) -> bool:
        """Create the file exclusively; False when it exists."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return True

    def read(self) -> dict[str, Any] | None:
        """The file's JSON content."""
        try:
            return _parse(self.path.read_text())
        except OSError:
            return None

    def replace(self, text: str) -> None:
        """Write a temporary file and rename it over the lock: readers never see half of it."""
        # unique across hosts: the drivers of a multi-node job rewrite one lock on a shared file system
        tmp = self.path.with_name(f"{self.path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_text(text)
        tmp.replace(self.path)

    def remove(self) -> None:
        """Unlink the file."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class RemoteLockFile:
    """A lock object in an fsspec store: written when absent, then read back to see who won."""

    def __init__(self, url: str, settle_s: float = REMOTE_SETTLE_S) -> None:
        self.location = url
        self.fs, self.path = url_to_fs(url)
        self.settle_s = settle_s

    def create(self, text: str) -> bool:
        """Write the object when there is none; after :attr:`settle_s`, whether it still holds *text*.

        A job that wrote its own lock in between (the race no plain object store closes) has
        replaced ours: the read-back sees it, and this job is the one that backs off.
        """
        if self._cat() is not None:
            return False
        self.fs.pipe_file(self.path, text.encode())
        time.sleep(self.settle_s)
        return self._cat() == text.encode()

    def read(self) -> dict[str, Any] | None:
        """The object's JSON content (read afresh: no listing cache is consulted)."""
        return _parse(self._cat())

    def replace(self, text: str) -> None:
        """Overwrite the object (one PUT: readers see the old or the new content)."""
        self.fs.pipe_file(self.path, text.encode())

    def remove(self) -> None:
        """Delete the object."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.path)

    def _cat(self) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None


def lock_file_at(directory: str | Path, name: str = LOCK_FILE) -> LockFile:
    """The lock file *name* of *directory*: a local path or any fsspec URL."""
    fs, root = url_to_fs(str(directory))
    if isinstance(fs, LocalFileSystem):
        return LocalLockFile(Path(root) / name)
    return RemoteLockFile(f"{str(directory).rstrip('/')}/{name}")


class DirLock:
    """The lock on one directory, held by this process until :meth:`release`.

    *key* and *fix* make the refusal's :class:`Problem` (``{lock}`` in *fix* names the lock
    file, *file_name* in *directory*); *run_dir*, the holder's run dir, is recorded so a
    refused job can name it. *job* names a job several drivers run together (the nodes of a
    multi-node job): a lock held by a live driver of the same *job* is joined, not refused
    (:attr:`joined`); every member keeps its heartbeat, and the last one to release removes it.
    """

    def __init__(
        self,
        directory: str | Path,
        key: str,
        fix: str,
        run_dir: Path | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        file_name: str = LOCK_FILE,
        job: str | None = None,
    ) -> None:
        self.directory = str(directory)
        self.file = lock_file_at(directory, file_name)
        self.key = key
        self.fix = fix
        self.heartbeat_s = heartbeat_s
        self.job = job
        self._me: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "token": uuid.uuid4().hex,
            "heartbeat": time.time(),
        }
        self._content: dict[str, Any] = {
            **self._me,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        if run_dir is not None:
            self._content["run_dir"] = str(run_dir)
        if job is not None:
            self._content["job"] = job
            self._content["members"] = [self._me]
        self.joined = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lock (or join it: a live driver of this *job* holds it), or raise :class:`DirBusy` naming the live holder."""
        for _ in range(3):
            if self.file.create(json.dumps(self._content)):
                break
            holder = self.file.read()
            if holder is not None and holder_is_alive(holder):
                if not self._same_job(holder):
                    raise self._busy(holder)
                self._write_member(holder)  # another node's driver of this job holds it for both
                self.joined = True
                break
            log.warning(
                "taking over the stale lock %s (holder %s)",
                self.file.location,
                "unreadable" if holder is None else f"pid {holder.get('pid')} on {holder.get('host')}",
            )
            self.file.remove()
        else:  # pragma: no cover - three live races in a row
            raise DirBusy(Problem(self.key, f"could not lock {self.file.location}", "retry"))
        self._thread = threading.Thread(target=self._beat, name="blocks-dir-lock", daemon=True)
        self._thread.start()

    def refuse_if_held(self) -> None:
        """Raise :class:`DirBusy` when a live job (not this lock's *job*) holds the directory; take nothing, write nothing."""
        holder = self.file.read()
        if holder is not None and holder_is_alive(holder) and not self._same_job(holder):
            raise self._busy(holder)

    def _same_job(self, holder: dict[str, Any]) -> bool:
        return self.job is not None and holder.get("job") == self.job

    def _busy(self, holder: dict[str, Any]) -> DirBusy:
        who = next(iter(live_members(holder)), holder)  # the first driver may have ended, a joined one not
        where = (
            f", run dir {holder['run_dir']}" if holder.get("run_dir") not in (None, self.directory) else ""
        )
        return DirBusy(
            Problem(
                self.key,
                f"{self.directory} is in use by another job: pid {who.get('pid')} on host "
                f"{who.get('host')}, started {holder.get('started')}{where}",
                self.fix.format(lock=self.file.location),
            )
        )

    def _write_member(self, holder: dict[str, Any], leaving: bool = False) -> None:
        """Rewrite the shared lock *holder* with this driver's entry refreshed (or, *leaving*, without it).

        Members found dead are dropped; the lock is removed when no live member is left.
        """
        now = time.time()
        self._me["heartbeat"] = now
        others = [m for m in live_members(holder, now) if m.get("token") != self._me["token"]]
        kept = others if leaving else [*others, self._me]
        if not kept:
            self.file.remove()
            return
        first = kept[0]
        holder.update(
            members=kept,
            host=first.get("host"),
            pid=first.get("pid"),
            token=first.get("token"),
            heartbeat=max(float(m.get("heartbeat", 0)) for m in kept),
        )
        self.file.replace(json.dumps(holder))

    def _ours(self) -> bool:
        holder = self.file.read()
        return holder is not None and holder.get("token") == self._me["token"]

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with contextlib.suppress(Exception):  # a store that fails once is retried at the next beat
                if not self._refresh():
                    log.warning(
                        "the lock %s is no longer this job's: another job took it over", self.file.location
                    )
                    return

    def _refresh(self) -> bool:
        """Refresh this driver's heartbeat in the lock; False when another job holds it now."""
        if self.job is None:
            if not self._ours():
                return False
            self._me["heartbeat"] = self._content["heartbeat"] = time.time()
            self.file.replace(json.dumps(self._content))
            return True
        holder = self.file.read()
        if holder is None:  # removed by a member that missed this one's entry (see the module's docstring)
            self._me["heartbeat"] = time.time()
            self.file.create(json.dumps({**self._content, **self._me, "members": [self._me]}))
            return True  # created, or another driver was quicker: the next beat sees whose it is
        if not self._same_job(holder):
            return False
        self._write_member(holder)
        return True

    def release(self) -> None:
        """Stop the heartbeat and give the lock back: remove it when still ours (the last live member of its *job*)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(Exception):
            if self.job is None:
                if self._ours():
                    self.file.remove()
                return
            holder = self.file.read()
            if holder is not None and self._same_job(holder):
                self._write_member(holder, leaving=True)


@contextlib.contextmanager
def held_lock(lock: DirLock) -> Iterator[DirLock]:
    """Hold *lock* for the duration of the block."""
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()


def locked(run_dir: Path, job: str | None = None) -> contextlib.AbstractContextManager[DirLock]:
    """Hold the lock on *run_dir* for the duration of the block (join it when the drivers of *job* share it)."""
    return held_lock(DirLock(run_dir, "hydra.run.dir", RUN_DIR_FIX, job=job))


def is_held(directory: str | Path) -> bool:
    """Whether a live job holds *directory*'s lock (the run-dir lock); reads it, takes nothing."""
    holder = lock_file_at(directory).read()
    return holder is not None and holder_is_alive(holder)


@contextlib.contextmanager
def checkpoint_dir_locked(directory: str, run_dir: Path, job: str | None = None) -> Iterator[DirLock]:
    """Hold the lock on the checkpoint *directory* of the job in *run_dir* for the duration of the block.

    A *directory* that is another live job's run dir is refused too. The drivers of one
    multi-node *job* share the lock (:class:`DirLock`). Storage the lock cannot
    be written to is refused like the storage check refuses it (a :class:`BlocksError` on
    ``checkpoint.dir``), not with a traceback.
    """
    lock = DirLock(
        directory,
        "checkpoint.dir",
        CHECKPOINT_DIR_FIX,
        run_dir=run_dir,
        file_name=CHECKPOINT_LOCK_FILE,
        job=job,
    )
    try:
        if not (
            isinstance(lock.file, LocalLockFile) and lock.file.path.parent.resolve() == run_dir.resolve()
        ):
            # another live job's run dir is that job's, whatever it holds
            DirLock(directory, "checkpoint.dir", CHECKPOINT_DIR_FIX, job=job).refuse_if_held()
        lock.acquire()
    except DirBusy:
        raise
    except Exception as exc:
        raise unwritable(directory, exc) from None
    try:
        yield lock
    finally:
        lock.release()
