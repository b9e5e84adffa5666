"""Shard files on local disk: read in place when local, else fetched through fsspec into a size-limited cache."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import fsspec

from blocks.data.shards.manifest import Manifest, content_digest
from blocks.spec.errors import BlocksError, Problem

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

URL_DIR = re.compile(r"[0-9a-f]{16}")
"""The cache's folders of fetched shards, one per shard directory URL (``data.source``'s prepared shards live elsewhere)."""

CACHED_COPY = re.compile(r"[0-9a-f]{16}-")
"""How the name of a fetched shard's copy begins (its content key): eviction removes nothing else."""


def default_cache_dir() -> str:
    """``$BLOCKS_CACHE_DIR`` or ``~/.cache/blocks/shards``."""
    return os.environ.get("BLOCKS_CACHE_DIR") or str(Path.home() / ".cache" / "blocks" / "shards")


def is_local(url: str) -> bool:
    """Whether *url* is on the local file system (then shards are read in place)."""
    fs, _ = fsspec.core.url_to_fs(url)
    return "file" in fs.protocol or "local" in fs.protocol


def shard_keys(manifest: Manifest) -> dict[str, tuple[str, int]]:
    """Each shard file's content key and expected size in bytes.

    The key is the shard's sha256 where the manifest records it, else a digest of the whole
    manifest's content and the name: shards prepared again at the same URL never match an
    old cached copy.
    """
    whole = content_digest(manifest)
    return {
        s.file: (
            s.sha256[:16] or hashlib.sha256(f"{whole}|{s.file}".encode()).hexdigest()[:16],
            s.tokens * manifest.itemsize,
        )
        for split in manifest.splits
        for s in manifest.shards(split)
    }


class ShardCache:
    """Local paths of a shard directory's files, fetched ahead in a background thread.

    Remote files are copied into ``cache_dir/<hash of url>/<content key>-<name>`` (written
    under a temporary name and renamed, so a reader in another process never sees half a
    file); a cached copy is used only when its content key and size match the manifest's
    shard. Before a fetch the least recently used files of the whole cache directory (every
    shard directory's) are removed until the new one fits under ``limit_bytes``; a process
    that still has a removed file mapped keeps reading it.
    """

    def __init__(
        self,
        url: str,
        cache_dir: str,
        limit_bytes: int,
        *,
        prefetch: int = 2,
        shards: dict[str, tuple[str, int]] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.local = is_local(self.url)
        self.cache_dir = Path(cache_dir)
        self.root = self.cache_dir / hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.shards = shards or {}
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
            path = Path(root) / name
            self._check_size(name, path.stat().st_size)
            return path
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

    def _target(self, name: str) -> Path:
        key = self.shards.get(name)
        return self.root / (f"{key[0]}-{name}" if key else name)

    def _check_size(self, name: str, size: int) -> None:
        """Raise when shard *name* does not hold the bytes its manifest says."""
        expected = self.shards.get(name, (None, size))[1]
        if size != expected:
            raise BlocksError(
                Problem(
                    "data.path",
                    f"shard file {name} in '{self.url}' holds {size} bytes; its manifest says {expected}",
                    f"prepare the shards again: blocks data prepare SOURCE {self.url}",
                    check="shard-manifest",
                )
            )

    def _usable(self, target: Path, name: str) -> bool:
        """Whether the cached copy is there and whole (a copy cut short is removed)."""
        try:
            size = target.stat().st_size
        except FileNotFoundError:
            return False
        if name in self.shards and size != self.shards[name][1]:
            target.unlink(missing_ok=True)
            return False
        return True

    def _cached(self, name: str) -> bool:
        return self._usable(self._target(name), name)

    def _fetch(self, name: str) -> Path:
        target = self._target(name)
        if self._usable(target, name):
            os.utime(target)  # most recently used
            return target
        self.root.mkdir(parents=True, exist_ok=True)
        fs, remote = fsspec.core.url_to_fs(f"{self.url}/{name}")
        size = int(fs.size(remote))
        self._check_size(name, size)
        with self._lock:  # evict and reserve as one step, so concurrent fetches cannot overshoot together
            self._evict(size, keep=target.name)
            self._reserved += size
        import tempfile

        handle, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{name}.")
        os.close(handle)
        try:
            fs.get_file(remote, tmp)
            self._check_size(name, os.path.getsize(tmp))  # the object changed since its size was read
            os.replace(tmp, target)
        finally:
            with self._lock:
                self._reserved -= size
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target

    def _evict(self, incoming: int, *, keep: str) -> None:
        """Remove least recently used files of the whole cache directory until *incoming* more bytes fit (lock held)."""
        stats = []
        for folder in self.cache_dir.iterdir():
            if not URL_DIR.fullmatch(folder.name) or not folder.is_dir():
                continue
            for path in folder.iterdir():
                try:
                    if CACHED_COPY.match(path.name) and path.is_file():
                        stats.append((path, path.stat()))
                except FileNotFoundError:  # another process evicted it meanwhile
                    continue
        used = sum(stat.st_size for _, stat in stats) + self._reserved
        busy = {self._target(name) for name in self._pending} | {self.root / keep}
        for old, stat in sorted(stats, key=lambda item: item[1].st_mtime):
            if used + incoming <= self.limit_bytes:
                break
            if old in busy:
                continue
            old.unlink(missing_ok=True)
            used -= stat.st_size
