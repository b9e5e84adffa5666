"""Committed checkpoints in any fsspec location: naming, manifests, verification, retention (torch-free).

A checkpoint is a directory ``step-<N>`` under ``checkpoint.dir``. Its files are written
first and ``MANIFEST.json`` last; the manifest lists every file with its size and sha256.
A directory without a manifest is uncommitted (a save that never finished) and is never
resumed from or counted for retention; leftovers are removed before a run starts saving.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import fsspec
from fsspec.core import url_to_fs

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
FORMAT = "blocks-checkpoint/1"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir_name(step: int) -> str:
    """The directory name of the checkpoint at optimizer step *step*."""
    return f"step-{step:09d}"


def join(base: str, *parts: str) -> str:
    """Join URL or path parts with ``/``."""
    return "/".join([base.rstrip("/"), *parts])


def file_digest(fs: fsspec.AbstractFileSystem, path: str) -> tuple[int, str]:
    """Size and sha256 of one file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with fs.open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """What a committed checkpoint holds.

    Attributes:
        step: optimizer step the checkpoint was taken after.
        epoch: epoch it was taken in.
        world_size: processes that trained up to it.
        sharded: whether the model and optimizer are DCP shards (FSDP) or one file.
        global_batch: samples per optimizer step; a resume must keep it to continue the same stream.
        block_digests: sha256 of each block that shapes the weights (model, task, data), to
            refuse resuming a different job.
        metrics: metric values at save time (for ``keep_best``).
        files: relative path → ``{"size": int, "sha256": str}``.
    """

    step: int
    epoch: int
    world_size: int
    sharded: bool
    global_batch: int
    block_digests: dict[str, str]
    metrics: dict[str, float] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    format: str = FORMAT

    def to_json(self) -> str:
        """The manifest file's content."""
        return json.dumps(self.__dict__, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse a manifest file's content."""
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Committed:
    """A committed checkpoint found in a checkpoint directory."""

    url: str
    manifest: Manifest


class CheckpointError(Exception):
    """A checkpoint is missing, uncommitted, corrupt or from another job."""


class HashingWriter:
    """A binary file wrapper that computes the size and sha256 of what passes through it.

    Hashing while writing spares commit a second read of the file.
    """

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write *data* and add it to the digest."""
        self._sha.update(data)
        self.size += len(data)
        return self._fh.write(data)

    def flush(self) -> None:
        """Flush the wrapped file."""
        self._fh.flush()

    @property
    def digest(self) -> tuple[int, str]:
        """``(size, sha256 hex)`` of everything written so far."""
        return self.size, self._sha.hexdigest()


def commit(url: str, manifest: Manifest, known: Mapping[str, tuple[int, str]] | None = None) -> Manifest:
    """Hash every file under *url* and write the manifest last, which commits the checkpoint.

    *known* maps relative paths to ``(size, sha256)`` already computed while writing them.
    """
    fs, root = url_to_fs(url)
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(fs.find(root)):
        relative = path[len(root.rstrip("/")) + 1 :]
        if relative == MANIFEST:
            continue
        size, sha = (known or {}).get(relative) or file_digest(fs, path)
        files[relative] = {"size": size, "sha256": sha}
    final = Manifest(**{**manifest.__dict__, "files": files})
    with fs.open(join(root, MANIFEST), "w") as fh:
        fh.write(final.to_json())
    return final


def read_manifest(url: str) -> Manifest:
    """The manifest of the checkpoint at *url*; :class:`CheckpointError` if it is not committed."""
    fs, root = url_to_fs(url)
    path = join(root, MANIFEST)
    if not fs.exists(path):
        raise CheckpointError(f"{url} is not a committed checkpoint (no {MANIFEST})")
    try:
        return Manifest.from_json(fs.cat_file(path).decode())
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{url}: unreadable {MANIFEST}: {exc}") from None


def verify(url: str) -> Manifest:
    """Check every file against the manifest (size, then sha256); raise :class:`CheckpointError` on a mismatch."""
    manifest = read_manifest(url)
    fs, root = url_to_fs(url)
    for relative, expected in manifest.files.items():
        path = join(root, relative)
        if not fs.exists(path):
            raise CheckpointError(f"{url}: {relative} is missing")
        size, sha = file_digest(fs, path)
        if size != expected["size"] or sha != expected["sha256"]:
            raise CheckpointError(f"{url}: {relative} does not match the manifest (corrupt or modified)")
    return manifest


def scan(directory: str) -> tuple[list[Committed], list[str]]:
    """Committed checkpoints in *directory* (oldest first) and the URLs of uncommitted ones."""
    fs, root = url_to_fs(directory)
    if not fs.exists(root):
        return [], []
    committed: list[Committed] = []
    uncommitted: list[str] = []
    for entry in fs.ls(root, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if not _STEP_DIR.match(name):
            continue
        url = join(directory, name)
        try:
            committed.append(Committed(url, read_manifest(url)))
        except CheckpointError:
            uncommitted.append(url)
    committed.sort(key=lambda c: c.manifest.step)
    return committed, uncommitted


def remove(url: str) -> None:
    """Delete a checkpoint directory (manifest first, so a half-deleted one is never taken as committed)."""
    fs, root = url_to_fs(url)
    if fs.exists(join(root, MANIFEST)):
        fs.rm(join(root, MANIFEST))
    if fs.exists(root):
        fs.rm(root, recursive=True)


def newest_valid(directory: str) -> Committed | None:
    """The newest committed checkpoint whose files match its manifest; corrupt ones are skipped with a warning."""
    committed, _ = scan(directory)
    for candidate in reversed(committed):
        try:
            verify(candidate.url)
        except CheckpointError as exc:
            log.warning("skipping checkpoint %s: %s; falling back to an older one", candidate.url, exc)
            continue
        return candidate
    return None


def to_delete(
    committed: Iterable[Committed],
    *,
    keep_last: int,
    keep_best: int = 0,
    monitor: str | None = None,
    mode: str = "min",
    protected: Iterable[str] = (),
) -> list[str]:
    """URLs retention may delete: not among the newest ``keep_last``, the best ``keep_best``, or *protected*.

    The newest committed checkpoint is always kept.
    """
    ordered = sorted(committed, key=lambda c: c.manifest.step)
    keep = {c.url for c in ordered[-max(1, keep_last) :]} | set(protected)
    if keep_best and monitor:
        scored = [c for c in ordered if monitor in c.manifest.metrics]
        scored.sort(key=lambda c: c.manifest.metrics[monitor], reverse=mode == "max")
        keep |= {c.url for c in scored[:keep_best]}
    return [c.url for c in ordered if c.url not in keep]


def block_digests(config: Mapping[str, Any]) -> dict[str, str]:
    """sha256 of the config of each block that shapes the weights (model, task, data's content)."""
    shaping = {
        "model": config.get("model", {}),
        "task": config.get("task", {}),
        "data": {
            k: v for k, v in dict(config.get("data", {})).items() if k not in ("batch_size", "num_workers")
        },
    }
    return {
        kind: hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
        for kind, value in shaping.items()
    }
