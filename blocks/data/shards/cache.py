"""Shard files on local disk: read in place when local, else fetched through fsspec into a size-limited cache."""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import fsspec

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor


def default_cache_dir() -> str:
    """``$BLOCKS_CACHE_DIR`` or ``~/.cache/blocks/shards``."""
    return os.environ.get("BLOCKS_CACHE_DIR") or str(Path.home() / ".cache" / "blocks" / "shards")


def is_local(url: str) -> bool:
    """Whether *url* is on the local file system (then shards are read in place)."""
    fs, _ = fsspec.core.url_to_fs(url)
    return "file" in fs.protocol or "local" in fs.protocol


class ShardCache:
    """Local paths of a shard directory's files, fetched ahead in a background thread.

    Remote files are copied into ``cache_dir/<hash of url>/`` (written under a temporary name
    and renamed, so a reader in another process never sees half a file). Before a fetch the
    least recently used files are removed until the new one fits under ``limit_bytes``; a
    process that still has a removed file mapped keeps reading it.
    """

    def __init__(self, url: str, cache_dir: str, limit_bytes: int, *, prefetch: int = 2) -> None:
        self.url = url.rstrip("/")
        self.local = is_local(self.url)
        self.root = Path(cache_dir) / hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.limit_bytes = limit_bytes
        self.prefetch = prefetch
        self._lock = threading.Lock()
        self._pending: dict[str, Future[Path]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._reserved = 0  # bytes of the fetches in flight, not yet in the directory listing

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state.update(_lock=None, _pending={}, _pool=None, _reserved=0)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def path(self, name: str) -> Path:
        """The local path of shard file *name*, fetched now if not cached (waits for a prefetch in flight)."""
        if self.local:
            _, root = fsspec.core.url_to_fs(self.url)
            return Path(root) / name
        with self._lock:
            pending = self._pending.get(name)
        if pending is not None:
            return pending.result()
        return self._fetch(name)

    def fetch_ahead(self, names: list[str]) -> None:
        """Start fetching the next shard files in the background (at most ``prefetch`` of them)."""
        if self.local or self.prefetch <= 0:
            return
        started: dict[str, Future[Path]] = {}
        with self._lock:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="blocks-shards")
            for name in names[: self.prefetch]:
                if name not in self._pending and not self._cached(name):
                    started[name] = self._pending[name] = self._pool.submit(self._fetch, name)
        # Outside the lock: a fetch that has already finished (the file appeared meanwhile, or
        # the read failed) runs its callback right here, and the callback takes the lock.
        for name, future in started.items():
            future.add_done_callback(functools.partial(self._done, name))

    def _done(self, name: str, future: Future[Path]) -> None:
        with self._lock:
            if self._pending.get(name) is future:
                del self._pending[name]

    def _cached(self, name: str) -> bool:
        return (self.root / name).exists()

    def _fetch(self, name: str) -> Path:
        target = self.root / name
        if target.exists():
            os.utime(target)  # most recently used
            return target
        self.root.mkdir(parents=True, exist_ok=True)
        fs, remote = fsspec.core.url_to_fs(f"{self.url}/{name}")
        size = int(fs.size(remote))
        with self._lock:  # evict and reserve as one step, so concurrent fetches cannot overshoot together
            self._evict(size, keep=name)
            self._reserved += size
        import tempfile

        handle, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{name}.")
        os.close(handle)
        try:
            fs.get_file(remote, tmp)
            os.replace(tmp, target)
        finally:
            with self._lock:
                self._reserved -= size
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target

    def _evict(self, incoming: int, *, keep: str) -> None:
        """Remove least recently used files until *incoming* more bytes fit under the limit (lock held)."""
        files = [p for p in self.root.iterdir() if p.is_file() and not p.name.startswith(".")]
        used = sum(p.stat().st_size for p in files) + self._reserved
        busy = set(self._pending) | {keep}
        for old in sorted(files, key=lambda p: p.stat().st_mtime):
            if used + incoming <= self.limit_bytes:
                break
            if old.name in busy:
                continue
            size = old.stat().st_size
            old.unlink(missing_ok=True)
            used -= size
