"""Committed checkpoints in any fsspec location: naming, manifests, verification, retention (torch-free).

A checkpoint is a directory ``step-<N>`` under ``checkpoint.dir``. Its files are written
first and ``MANIFEST.json`` last; the manifest lists every file with its size and a
digest: XXH3-128 for checkpoints written now, BLAKE3 or sha256 for those written by earlier
versions (each entry names its algorithm, so all verify).
A directory without a manifest (or, in blocks' own, with an empty one) is uncommitted (a save that never finished) and is never
resumed from or counted for retention; leftovers are removed before a run starts saving, but
only those carrying :data:`MARKER`, the file blocks writes first into every checkpoint
directory it creates: a ``step-<N>`` entry blocks did not write is left alone. A manifest
that does not match its schema makes the checkpoint corrupt, like a file that does not
match its digest: resume skips it and falls back to an older one.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import hashlib
import json
import logging
import math
import mmap
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol, TypeVar

import blake3
import fsspec
import xxhash
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
MANIFEST_WRITING = ".MANIFEST.json.writing"
"""What a local manifest is written as before it is renamed into place (see :func:`commit`)."""
MARKER = ".blocks-checkpoint"
"""Written first into each checkpoint directory blocks creates: only such directories are ever cleaned up."""
STATE_FILE = "state.pt"
"""The file every checkpoint holds (the training state, or its non-sharded rest)."""
PACKAGES_FILE = "packages.json"
"""Beside the state: which distribution and version made each block the run trained with, as its
caller recorded them (plain JSON, ``{"packages": ...}`` as in ``plan.json``). A copy of the
checkpoint keeps it; a run dir's ``plan.json`` is rewritten by each later session."""
SHARDS_DIR = "dcp"
"""Where a sharded checkpoint keeps its DCP shards and their ``.metadata``."""
SHARDS_METADATA = f"{SHARDS_DIR}/.metadata"
FORMAT = "blocks-checkpoint/4"
"""Written into new manifests (version 2 let each file entry name its algorithm; version 3 adds
XXH3-128; version 4 the ``job`` that saved it, so an older blocks says the format is newer rather
than that the manifest is damaged)."""
HASH = "xxh3_128"
"""The digest new manifests record.

The manifest guards against torn writes, truncated uploads and bit rot, not against an
attacker: whoever can rewrite ``state.pt`` can rewrite the manifest beside it, so a
cryptographic digest would buy nothing here (loading never runs code: ``weights_only``).
XXH3-128 detects accidental damage as surely and hashes several times faster than BLAKE3.
"""
_HASHERS: dict[str, Callable[[], Any]] = {
    "xxh3_128": xxhash.xxh3_128,
    "blake3": blake3.blake3,
    "sha256": hashlib.sha256,
}
DIGEST_HEX_LENGTHS = {name: make().digest_size * 2 for name, make in _HASHERS.items()}
"""Digest algorithms a manifest entry may name (the entry's key) and their hex digest lengths."""
ALGORITHMS_BY_FORMAT = {
    "blocks-checkpoint/1": ("sha256",),
    "blocks-checkpoint/2": ("blake3", "sha256"),
    "blocks-checkpoint/3": tuple(DIGEST_HEX_LENGTHS),
    FORMAT: tuple(DIGEST_HEX_LENGTHS),
}
"""Manifest formats this version verifies, each with the algorithms its entries may name."""
_STEP_DIR = re.compile(r"^step-(\d+)$")
_HEX_DIGITS = frozenset("0123456789abcdef")
_CHUNK = 1 << 20
_MAPPED_CHUNK = 1 << 23  # bytes mapped and hashed per call: the GIL comes back between calls
_FETCH_CHUNK = 1 << 23  # bytes read from an object store per call when a state is kept (see keeping)
_HASH_THREADS = max(2, min(8, os.cpu_count() or 1))
"""Files hashed at once: xxhash, hashlib and file reads release the GIL, so each thread uses a core
(and an object store's latency overlaps).
"""
_T = TypeVar("_T")


class _ReadsInto(Protocol):
    """A binary file: the built-in one or fsspec's."""

    def readinto(self, buffer: bytearray, /) -> int: ...


class Hasher(Protocol):
    """What :func:`new_hasher` returns (hashlib's, blake3's and xxhash's objects all fit)."""

    def update(self, data: bytes | bytearray | memoryview, /) -> Any: ...  # noqa: D102

    def hexdigest(self) -> str: ...  # noqa: D102


def step_dir_name(step: int) -> str:
    """The directory name of the checkpoint at optimizer step *step*."""
    return f"step-{step:09d}"


def join(base: str, *parts: str) -> str:
    """Join URL or path parts with ``/``."""
    return "/".join([base.rstrip("/"), *parts])


def new_hasher(algorithm: str = HASH) -> Hasher:
    """A fresh digest object for *algorithm* (a key of :data:`DIGEST_HEX_LENGTHS`)."""
    if algorithm in _HASHERS:
        return _HASHERS[algorithm]()
    raise ValueError(f"unknown digest algorithm {algorithm!r} (known: {', '.join(DIGEST_HEX_LENGTHS)})")


def file_digest(fs: fsspec.AbstractFileSystem, path: str, algorithm: str = HASH) -> tuple[int, str]:
    """Size and *algorithm* hex digest of one file, read in chunks into one reused buffer.

    A local file is hashed through a read-only memory map instead: the hash reads the page
    cache where it is, with no copy into a buffer, about half the time and memory traffic of
    a read (a resume hashes ``state.pt`` beside ``torch.load`` reading the same file). A file
    that cannot be mapped is read as any other. As with every memory-mapped load, a file
    truncated by another process while it is hashed ends this one with ``SIGBUS``; ``blocks``
    never rewrites a committed file, and one job at a time writes a checkpoint dir.
    """
    if isinstance(fs, LocalFileSystem):
        with open(path, "rb") as fh:
            return _mapped_digest(fh.fileno(), algorithm) or _read_digest(fh, algorithm)
    with fs.open(path, "rb") as fh:
        return _read_digest(fh, algorithm)


def _read_digest(fh: _ReadsInto, algorithm: str) -> tuple[int, str]:
    """Size and digest of what is left to read in *fh*."""
    digest = new_hasher(algorithm)
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    size = 0
    while count := fh.readinto(buffer):
        digest.update(view[:count])
        size += count
    return size, digest.hexdigest()


def _mapped_digest(fileno: int, algorithm: str) -> tuple[int, str] | None:
    """Size and digest of the open file *fileno* hashed through a memory map; None where it cannot be mapped."""
    size = os.fstat(fileno).st_size
    if not size:  # empty, or a pipe or /proc file whose size says nothing: read it
        return None
    digest = new_hasher(algorithm)
    for start in range(0, size, _MAPPED_CHUNK):
        # One window mapped at a time: the pages hashed leave the process with their window, so
        # its resident memory (what Slurm and Ray's memory monitors count) never holds the file.
        try:
            window = mmap.mmap(
                fileno, min(_MAPPED_CHUNK, size - start), access=mmap.ACCESS_READ, offset=start
            )
        except (OSError, ValueError):  # a FUSE or 9p mount without shared mappings
            return None
        with window, memoryview(window) as view:
            digest.update(view)
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
        block_digests: sha256 of what a resume must share with the run that saved (model, task,
            data, optimizer kind, seed, the data's content), to refuse resuming a different job.
        metrics: the metrics logged at ``step`` (for ``keep_best``); one last logged earlier (a
            validation metric between validations) is left out. Manifests of earlier versions
            may hold such stale values.
        files: relative path → ``{"size": int, ALGORITHM: hex digest}`` (ALGORITHM a key of
            :data:`DIGEST_HEX_LENGTHS`).
        format: the manifest format (:data:`FORMAT` when written by this version).
        job: the id of the job that saved it (see :class:`blocks.checkpoint.resume.Start`;
            empty in checkpoints saved before it was recorded).
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
    job: str = ""

    def to_json(self) -> str:
        """The manifest file's content."""
        return json.dumps(self.__dict__, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse a manifest file's content; :class:`ValueError` naming the field when it breaks the schema."""
        data = json.loads(text)
        validate_manifest(data)
        return cls(**data)


def _is_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def validate_manifest(data: Any) -> None:
    """Check parsed manifest JSON against the schema; :class:`ValueError` names the first bad field.

    ``files`` must be a non-empty mapping of relative path → ``{"size": int >= 0, ALGORITHM: hex}``
    with exactly one algorithm its format allows (:data:`ALGORITHMS_BY_FORMAT`), and it must
    include ``state.pt`` (and a sharded checkpoint's ``dcp/.metadata``), so a damaged manifest
    can never turn verification off.
    """
    if not isinstance(data, dict):
        raise ValueError("the manifest is not a JSON object")
    required = {"step", "epoch", "world_size", "sharded", "global_batch", "block_digests"}
    known = required | {"metrics", "files", "format", "job"}
    if missing := sorted(required - data.keys()):
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    if unknown := sorted(data.keys() - known):
        raise ValueError(f"unknown field(s) {', '.join(unknown)}")
    for name, minimum in (("step", 0), ("epoch", 0), ("world_size", 1), ("global_batch", 0)):
        if not _is_int(data[name], minimum):
            raise ValueError(f"'{name}' must be an integer >= {minimum}, got {data[name]!r}")
    if not isinstance(data.get("job", ""), str):
        raise ValueError(f"'job' must be a string, got {data['job']!r}")
    if not isinstance(data["sharded"], bool):
        raise ValueError(f"'sharded' must be true or false, got {data['sharded']!r}")
    digests = data["block_digests"]
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise ValueError("'block_digests' must map block kinds to digests")
    metrics = data.get("metrics", {})
    if not isinstance(metrics, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in metrics.values()
    ):
        raise ValueError("'metrics' must map metric names to numbers")
    version = data.get("format", "blocks-checkpoint/1")  # the earliest manifests had no format field
    allowed = ALGORITHMS_BY_FORMAT.get(version)
    if allowed is None:
        raise ValueError(f"unknown format {version!r} (expected one of {', '.join(ALGORITHMS_BY_FORMAT)})")
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        raise ValueError("'files' must be a non-empty mapping of file → size and digest")
    for relative, entry in files.items():
        if not isinstance(entry, dict) or not _is_int(entry.get("size"), 0):
            raise ValueError(f"'files.{relative}.size' must be an integer >= 0")
        named = sorted(entry.keys() - {"size"})
        if len(named) != 1 or named[0] not in allowed:
            raise ValueError(
                f"'files.{relative}' must hold its size and one digest out of {', '.join(allowed)}, "
                f"got {', '.join(named) or 'none'}"
            )
        digest, length = entry[named[0]], DIGEST_HEX_LENGTHS[named[0]]
        if not (isinstance(digest, str) and len(digest) == length and set(digest) <= _HEX_DIGITS):
            raise ValueError(
                f"'files.{relative}.{named[0]}' must be a {named[0]} digest ({length} hex digits)"
            )
    if STATE_FILE not in files:
        raise ValueError(f"'files' does not list {STATE_FILE}")
    if data["sharded"] and SHARDS_METADATA not in files:
        raise ValueError(f"'files' of a sharded checkpoint does not list {SHARDS_METADATA}")


@dataclass(frozen=True)
class Committed:
    """A committed checkpoint found in a checkpoint directory."""

    url: str
    manifest: Manifest


class CheckpointError(Exception):
    """A checkpoint is missing, uncommitted, corrupt or from another job."""


def entry_digest(entry: Mapping[str, Any]) -> tuple[str, str]:
    """``(algorithm, hex digest)`` of one validated manifest file entry."""
    algorithm = next(name for name in DIGEST_HEX_LENGTHS if name in entry)
    return algorithm, entry[algorithm]


class HashingWriter:
    """A binary file wrapper that computes the size and :data:`HASH` digest of what passes through it.

    Hashing while writing spares commit a second read of the file.
    """

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._hash = new_hasher(HASH)
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write *data* and add it to the digest."""
        self._hash.update(data)
        self.size += len(data)
        return self._fh.write(data)

    def flush(self) -> None:
        """Flush the wrapped file."""
        self._fh.flush()

    @property
    def digest(self) -> tuple[int, str]:
        """``(size, hex digest)`` of everything written so far."""
        return self.size, self._hash.hexdigest()


def write_beside(url: str, files: Mapping[str, str]) -> None:
    """Write the small text *files* (name → content) into the checkpoint directory *url*; its commit lists them."""
    fs, root = url_to_fs(url)
    for name, text in files.items():
        with fs.open(join(root, name), "w") as fh:
            fh.write(text)


def read_beside(url: str, name: str) -> str | None:
    """The text of file *name* in the checkpoint directory *url*; None when it has none (older ones) or it cannot be read."""
    fs, root = url_to_fs(url)
    try:
        return fs.cat_file(join(root, name)).decode()
    except (OSError, UnicodeDecodeError):
        return None


def commit(url: str, manifest: Manifest, known: Mapping[str, tuple[int, str]] | None = None) -> Manifest:
    """Hash every file under *url* and write the manifest last, which commits the checkpoint.

    *known* maps relative paths to ``(size, hex digest)`` already computed while writing them
    (with :data:`HASH`, as :class:`HashingWriter` does).
    """
    fs, root = url_to_fs(url)
    known = known or {}
    paths = {path[len(root.rstrip("/")) + 1 :]: path for path in sorted(fs.find(root))}
    relatives = [relative for relative in paths if relative not in (MANIFEST, MARKER)]
    digests = _concurrently(
        [
            functools.partial(known.__getitem__, relative)
            if relative in known
            else functools.partial(file_digest, fs, paths[relative])
            for relative in relatives
        ]
    )
    files = {
        relative: {"size": size, HASH: digest}
        for relative, (size, digest) in zip(relatives, digests, strict=True)
    }
    final = Manifest(**{**manifest.__dict__, "files": files, "format": FORMAT})
    _write_manifest(fs, root, final.to_json())
    return final


def _write_manifest(fs: fsspec.AbstractFileSystem, root: str, text: str) -> None:
    """Write ``MANIFEST.json`` into *root* whole or not at all.

    On a local file system it is written as :data:`MANIFEST_WRITING`, synced, and renamed into
    place (the directory synced too): a process killed while writing leaves no manifest, so the
    save counts as unfinished, not as a damaged checkpoint. An object store makes a small
    object visible only once its single upload completes.
    """
    path = join(root, MANIFEST)
    if not isinstance(fs, LocalFileSystem):
        with fs.open(path, "w") as fh:
            fh.write(text)
        return
    temporary = join(root, MANIFEST_WRITING)
    with fs.open(temporary, "w") as fh:
        fh.write(text)
    _sync(temporary)
    os.replace(temporary, path)
    _sync(root)


def _sync(path: str) -> None:
    """Flush the local file or directory *path* to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_manifest(url: str) -> Manifest:
    """The manifest of the checkpoint at *url*; :class:`CheckpointError` if it is not committed."""
    fs, root = url_to_fs(url)
    path = join(root, MANIFEST)
    if not fs.exists(path):
        raise CheckpointError(f"{url} is not a committed checkpoint (no {MANIFEST})")
    try:
        manifest = Manifest.from_json(fs.cat_file(path).decode())
    except (ValueError, TypeError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{url}: damaged {MANIFEST}: {exc}") from None
    named = named_step(root)
    if named is not None and named != manifest.step:
        raise CheckpointError(
            f"{url}: damaged {MANIFEST}: it says step {manifest.step}, its directory step "
            f"{named} (a manifest copied or edited into another step's directory)"
        )
    return manifest


def named_step(url: str) -> int | None:
    """The step a ``step-<N>`` directory's name says (leading zeros or not); None for any other name."""
    match = _STEP_DIR.match(url.rstrip("/").rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def begin(url: str) -> None:
    """Create the checkpoint directory *url* and mark it as blocks' own before any state is written."""
    fs, root = url_to_fs(url)
    fs.makedirs(root, exist_ok=True)
    with fs.open(join(root, MARKER), "wb") as fh:
        fh.write(b"written by blocks; a step directory without MANIFEST.json is an unfinished save\n")


def is_ours(url: str) -> bool:
    """Whether blocks created the directory *url* (it holds :data:`MARKER` or a manifest, and is no link)."""
    fs, root = url_to_fs(url)
    if _is_link(fs, root):
        return False
    return bool(fs.exists(join(root, MARKER)) or fs.exists(join(root, MANIFEST)))


def _is_link(fs: Any, path: str) -> bool:
    try:
        return bool(fs.info(path).get("islink"))
    except FileNotFoundError:
        return False


def is_committed(url: str) -> bool:
    """Whether *url* holds a committed checkpoint whose manifest reads (its files are not verified)."""
    try:
        read_manifest(url)
    except CheckpointError:
        return False
    return True


def replace_ours(url: str, *, stale: bool = False) -> None:
    """Clear *url* for a new save of the same step; :class:`CheckpointError` if blocks did not create it.

    What is replaced: an unfinished save of that step, a checkpoint whose manifest is damaged,
    and, when *stale*, a committed checkpoint a longer earlier run left past the step this run
    started from (see :func:`to_delete`). Any other committed checkpoint is refused: a save must
    never delete a checkpoint a run may resume from (the one this run resumed from above all,
    whose rewrite a kill could cut short). An empty directory holds nothing to lose and is used
    as it is.
    """
    fs, root = url_to_fs(url)
    if not fs.exists(root) or not fs.ls(root, detail=False):
        return
    if not is_ours(url):
        raise CheckpointError(
            f"{url} exists but was not written by blocks; move it out of the checkpoint directory "
            "or set another checkpoint.dir"
        )
    if not stale and is_committed(url):
        raise CheckpointError(
            f"{url} already holds a committed checkpoint of this step that this run did not "
            "supersede: refusing to delete it to save again; move it out of checkpoint.dir, or "
            "set another checkpoint.dir"
        )
    remove(url)


def same_place(a: str, b: str) -> bool:
    """Whether the URLs or paths *a* and *b* name one location (a relative path and its absolute form do)."""
    (fs_a, path_a), (fs_b, path_b) = url_to_fs(a), url_to_fs(b)
    return bool(fs_a.unstrip_protocol(path_a).rstrip("/") == fs_b.unstrip_protocol(path_b).rstrip("/"))


_VERIFIED: dict[tuple[str, str], tuple[Any, str]] = {}
"""Files this process hashed and found matching: ``(protocol, path)`` → (fingerprint, hex digest)."""


def _fingerprint(info: Mapping[str, Any]) -> Any:
    """What changes when a file is rewritten: its size, modification time and ETag (those it has); None when it has neither.

    An object store's modification time counts whole seconds: its ETag tells apart a rewrite
    of the same size within the same second.
    """
    changed = tuple(
        str(info[key])
        for key in ("mtime", "LastModified", "last_modified", "ETag", "etag", "updated")
        if info.get(key)
    )
    return (info.get("size"), *changed) if changed else None


_KEPT: dict[tuple[str, str], tuple[Any, str, Any]] = {}
"""The ``state.pt`` a resume loaded while verifying it on an object store (:func:`keeping`), until its load
takes it: ``(protocol, path)`` → (fingerprint, hex digest, what the loader returned). One entry at most."""
_keeper: Callable[[str | BinaryIO, str], Any] | None = None
"""The loader :func:`keeping` installed (None outside it)."""


@contextlib.contextmanager
def keeping(load: Callable[[str | BinaryIO, str], Any]) -> Iterator[None]:
    """Within it, verifying a ``state.pt`` on an object store also loads it, from the same download.

    The file is downloaded once, in order, and hashed as its bytes arrive, into a local copy
    (:func:`spooled`); once the digest matches, ``load(source, url)`` reads that copy and what
    it returns is kept for :func:`kept_state` (the resume's checks and its load read it there,
    not from the store). *source* is a path that opens the copy, which *load* should map rather
    than read (the copy has no name, and its disk space and pages last as long as tensors map
    them: in a run on the CPU, the optimizer state restored from it does until training ends),
    or an open file over the bytes in memory when the temporary directory has no room for it. A file
    that does not match is refused as ever, unloaded. A *load* that fails (a state that is
    unsafe to unpickle) keeps nothing: the later reader fails in turn. Local files are never
    kept (they are mapped and read where they are). One state at most is kept; keeping another
    drops it, and so does :func:`drop_kept`.
    """
    global _keeper
    previous, _keeper = _keeper, load
    try:
        yield
    finally:
        _keeper = previous


def kept_state(url: str, *, take: bool = False) -> Any | None:
    """What :func:`keeping` kept of checkpoint *url*'s ``state.pt``; None when nothing is kept or its files changed since.

    The checkpoint's files are checked as :func:`load_verified` checks them (unchanged since
    this process found them matching the manifest; any other is hashed again): a kept state
    is only handed out for the file it was loaded from. *take*: the caller is the state's
    last reader (the load of the resume); the keeping ends, so the state lives no longer than
    the caller holds it.
    """
    if not _KEPT:
        return None
    fs, root = url_to_fs(url)
    key = (_protocol(fs), join(root, STATE_FILE))
    entry = _KEPT.get(key)
    if take:
        drop_kept()
    if entry is None:
        return None
    manifest = read_manifest(url)
    _run_checks(
        [_FileCheck(url, manifest, relative) for relative in manifest.files if relative != STATE_FILE]
    )
    check = _FileCheck(url, manifest, STATE_FILE)
    fingerprint, digest, state = entry
    if not (check.known_good and check.fingerprint == fingerprint and check.wanted == digest):
        _KEPT.pop(key, None)
        return None
    return state


def drop_kept() -> None:
    """Forget the state :func:`keeping` kept (a process that will not load it: a driver that launches workers)."""
    _KEPT.clear()


_SPOOL_HEADROOM = 1 << 30
"""Free bytes a spooled copy must leave in the temporary directory (see :func:`spooled`)."""


@contextlib.contextmanager
def spooled(size: int) -> Iterator[tuple[BinaryIO, str] | None]:
    """A temporary file for a downloaded copy of *size* bytes and the path that opens it; None when there is no room.

    In the system's temporary directory (``TMPDIR``), when it has *size* bytes free and
    :data:`_SPOOL_HEADROOM` more: a state read from a copy on disk (mapped) is not held in
    memory twice, as bytes and as tensors. Where it has not, the bytes are held in memory. The
    file has no name (Linux opens it through ``/proc/self/fd``), so a process killed while it
    downloads leaves nothing behind; elsewhere it is a named file, removed on exit.
    """
    directory = tempfile.gettempdir()
    try:
        room = shutil.disk_usage(directory).free >= size + _SPOOL_HEADROOM
    except OSError:
        room = False
    if not room:
        yield None
        return
    with contextlib.ExitStack() as stack:
        copy: BinaryIO = stack.enter_context(tempfile.TemporaryFile(dir=directory, prefix="blocks-state-"))
        path = f"/proc/self/fd/{copy.fileno()}"
        if not os.path.exists(path):  # no /proc (macOS): a named copy
            named = stack.enter_context(tempfile.NamedTemporaryFile(dir=directory, prefix="blocks-state-"))
            copy, path = named, named.name  # type: ignore[assignment]  # a binary file
        yield copy, path


def _protocol(fs: fsspec.AbstractFileSystem) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


class _MemoryFile:
    """A read-only, seekable binary file over bytes in memory, read with ``readinto`` without a copy of them."""

    def __init__(self, data: bytearray) -> None:
        self._view, self._position = memoryview(data), 0

    def readable(self) -> bool:
        """Always true."""
        return True

    def seekable(self) -> bool:
        """Always true."""
        return True

    def tell(self) -> int:
        """The current position."""
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move like :meth:`io.IOBase.seek`."""
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: len(self._view)}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        """Copy up to ``len(buffer)`` bytes into *buffer*."""
        target = memoryview(buffer).cast("B")
        chunk = self._view[self._position : self._position + target.nbytes]
        target[: len(chunk)] = chunk
        self._position += len(chunk)
        return len(chunk)

    def read(self, size: int = -1) -> bytes:
        """Up to *size* bytes (all that is left when negative)."""
        end = len(self._view) if size < 0 else self._position + size
        data = self._view[self._position : end].tobytes()
        self._position += len(data)
        return data


def verify(url: str) -> Manifest:
    """Check every file against the manifest (size, then digest); raise :class:`CheckpointError` on a mismatch.

    Each file is hashed at most once per process: a file whose size and modification time (or
    ETag) are unchanged since this process found it matching is not read again (the driver's,
    the worker's and the loader's checks of one resume share one read). The files of a sharded
    checkpoint are hashed several at a time, and a shard file the manifest does not list is
    refused: DCP would read it unverified.
    """
    manifest = read_manifest(url)
    if manifest.sharded:
        _refuse_unlisted_shards(url, manifest)
    _run_checks([_FileCheck(url, manifest, relative) for relative in manifest.files])
    return manifest


def _refuse_unlisted_shards(url: str, manifest: Manifest) -> None:
    """:class:`CheckpointError` when ``dcp/`` of the sharded checkpoint at *url* holds a file its manifest does not list."""
    fs, root = url_to_fs(url)
    shards = join(root, SHARDS_DIR)
    unlisted = sorted(
        relative
        for relative in (f"{SHARDS_DIR}/{path[len(shards) + 1 :]}" for path in fs.find(shards))
        if relative not in manifest.files and not relative.endswith("/")  # an object store's folder marker
    )
    if unlisted:
        raise CheckpointError(
            f"{url}: {', '.join(unlisted)} not in the manifest (a shard written after the commit, "
            "or a manifest that lost entries): it cannot be verified"
        )


def _run_checks(checks: list[_FileCheck]) -> None:
    """Hash the files of *checks* not known good, several at once; the first mismatch in order is raised."""
    _concurrently([check.run for check in checks if not check.known_good])


def _concurrently(calls: list[Callable[[], _T]]) -> list[_T]:
    """The results of *calls* in order, up to :data:`_HASH_THREADS` running at once; the first error in order is raised."""
    if len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(min(len(calls), _HASH_THREADS), thread_name_prefix="blocks-hash") as pool:
        return [running.result() for running in [pool.submit(call) for call in calls]]


class _FileCheck:
    """The check of one manifest entry: whether it is still known good, and recording a match."""

    def __init__(self, url: str, manifest: Manifest, relative: str) -> None:
        self.url, self.relative = url, relative
        self.expected = manifest.files[relative]
        self.algorithm, self.wanted = entry_digest(self.expected)
        self.fs, root = url_to_fs(url)
        protocol = _protocol(self.fs)
        self.path = join(root, relative)
        local = isinstance(self.fs, LocalFileSystem)
        self.keeper = _keeper if relative == STATE_FILE and not local else None  # read in the caller's thread
        try:
            info = self.fs.info(self.path)
        except FileNotFoundError:
            raise CheckpointError(f"{url}: {relative} is missing") from None
        self.fingerprint, self.key = _fingerprint(info), (protocol, self.path)
        self.known_good = self.fingerprint is not None and _VERIFIED.get(self.key) == (
            self.fingerprint,
            self.wanted,
        )
        if not self.known_good and info.get("size") not in (None, self.expected["size"]):
            self.judge(info["size"], "")

    def run(self) -> None:
        """Hash the file unless it is known good; :class:`CheckpointError` on a mismatch.

        Within :func:`keeping`, an object store's ``state.pt`` is downloaded once into a local
        copy, hashed as it arrives, and loaded from there (see :func:`keeping`).
        """
        if self.known_good:
            return
        if self.keeper is None or self.fingerprint is None:
            self.judge(*file_digest(self.fs, self.path, self.algorithm))
            return
        _KEPT.clear()  # the state kept before goes first: two are never held at once
        with self.fetched() as source:
            try:
                state = self.keeper(source, self.url)
            except Exception:  # a state unsafe to load: its reader reports why later
                return
        _KEPT[self.key] = (self.fingerprint, self.wanted, state)

    @contextlib.contextmanager
    def fetched(self) -> Iterator[str | BinaryIO]:
        """The whole file, downloaded once and checked (:meth:`download`): a local copy's path, or the bytes in memory (:func:`spooled`).

        A copy the disk has no room for after all (the ranks of a job each make one) is given up
        for memory, with a warning: the file is downloaded again.
        """
        size = self.expected["size"]
        with spooled(size) as copy:
            if copy is not None:
                try:
                    self.download(memoryview(bytearray(min(_FETCH_CHUNK, size))), copy[0])
                    copy[0].flush()
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                        raise
                    log.warning(
                        "%s: no room left for a copy of %s (%s); reading it into memory",
                        self.url,
                        self.relative,
                        exc,
                    )
                else:
                    yield copy[1]
                    return
        data = bytearray(size)
        self.download(memoryview(data), None)
        yield _MemoryFile(data)  # type: ignore[misc]  # read/readinto/seek/tell

    def download(self, buffer: memoryview, sink: BinaryIO | None) -> None:
        """Read the file once, in order, hashing it as it arrives unless known good; :class:`CheckpointError` on a mismatch.

        Into *buffer*, which holds the whole file when *sink* is None; else chunk by chunk,
        each written to *sink*.
        """
        size = self.expected["size"]
        digest = None if self.known_good else new_hasher(self.algorithm)
        got = 0
        with self.fs.open(self.path, "rb") as fh:
            while got < size:
                at = got if sink is None else 0
                count = fh.readinto(buffer[at : at + min(_FETCH_CHUNK, size - got)])
                if not count:
                    break
                if digest is not None:
                    digest.update(buffer[at : at + count])
                if sink is not None:
                    sink.write(buffer[:count])
                got += count
            got += len(fh.read(1)) if got == size else 0  # one byte more: the file is longer than listed
        buffer.release()
        if digest is not None:
            self.judge(got, digest.hexdigest() if got == size else "")
        elif got != size:  # changed since it was found good, and its fingerprint did not show it
            self.judge(got, "")

    def judge(self, size: int, digest: str) -> None:
        """Record a match, or raise :class:`CheckpointError` for a file that differs from the manifest."""
        if size != self.expected["size"] or digest != self.wanted:
            _VERIFIED.pop(self.key, None)
            _KEPT.pop(self.key, None)
            raise CheckpointError(
                f"{self.url}: {self.relative} does not match the manifest (corrupt or modified)"
            )
        if self.fingerprint is not None:
            _VERIFIED[self.key] = (self.fingerprint, digest)


def load_verified(url: str, load: Callable[[BinaryIO], _T]) -> _T:
    """``load(state_file)`` once every file of *url* matches its manifest, reading ``state.pt`` once.

    The other files are verified first. On a local file system ``state.pt`` is hashed while
    *load* reads it, by a second thread that reads the file beside the load (the hash costs
    no time next to the load where a core is free). From an object store it is downloaded
    once, in order, into a local copy (:func:`spooled`; into memory where there is no room),
    hashed as the bytes arrive, and *load* reads the copy once it matches: a loader's reads jump
    about the file (a zip reader reads its end first), and read from the store they fetched
    parts of it twice or more. The copy lives only while *load* runs. A mismatch raises
    :class:`CheckpointError`, also when *load* itself failed on the damaged file; nothing
    *load* returned is handed out unverified. *load* must only read (it may see a corrupt file).
    """
    manifest = read_manifest(url)
    _run_checks(
        [_FileCheck(url, manifest, relative) for relative in manifest.files if relative != STATE_FILE]
    )
    check = _FileCheck(url, manifest, STATE_FILE)
    if not isinstance(check.fs, LocalFileSystem):
        with check.fetched() as source:
            if isinstance(source, str):
                with open(source, "rb") as fh:
                    return load(fh)
            return load(source)
    with check.fs.open(check.path, "rb") as fh:
        if check.known_good:
            return load(fh)
        with ThreadPoolExecutor(1, thread_name_prefix="blocks-hash") as pool:  # hash beside the load
            hashed = pool.submit(file_digest, check.fs, check.path, check.algorithm)
            return _judged(check, lambda: load(fh), hashed.result)


def _judged(check: _FileCheck, load: Callable[[], _T], digest: Callable[[], tuple[int, str]]) -> _T:
    """``load()``, handed out once *digest* matches *check*; a mismatch is raised also when the load failed."""
    try:
        result = load()
    except Exception:
        check.judge(*digest())  # a mismatch explains the failure: raise it instead
        raise
    check.judge(*digest())
    return result


@dataclass
class Listing:
    """What the ``step-<N>`` entries of a checkpoint directory are.

    Attributes:
        committed: checkpoints with a valid manifest, oldest first (their files are not verified yet).
        uncommitted: blocks' own directories without a manifest (saves that never finished),
            and empty ``step-<N>`` directories (a save killed before it marked its directory).
        damaged: ``(url, reason)`` of checkpoints whose manifest is unreadable or breaks the schema.
        foreign: ``step-<N>`` entries blocks did not write; never touched.
    """

    committed: list[Committed] = field(default_factory=list)
    uncommitted: list[str] = field(default_factory=list)
    damaged: list[tuple[str, str]] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)


def list_dir(directory: str) -> Listing:
    """Sort the ``step-<N>`` entries of *directory* into committed, uncommitted, damaged and foreign."""
    fs, root = url_to_fs(directory)
    listing = Listing()
    if not fs.exists(root):
        return listing
    for entry in fs.ls(root, detail=True):
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        step = named_step(name)
        if step is None:
            continue
        url, path = join(directory, name), join(root, name)
        named_by_blocks = name == step_dir_name(step)
        if entry.get("islink"):  # a link's target is not blocks' to resume from or delete
            listing.foreign.append(url)
        elif fs.exists(join(path, MANIFEST)) and not _torn_manifest(fs, path):
            try:
                listing.committed.append(Committed(url, read_manifest(url)))
            except CheckpointError as exc:
                listing.damaged.append((url, str(exc)))
        elif fs.exists(join(path, MARKER)) or (
            named_by_blocks and fs.isdir(path) and not fs.ls(path, detail=False)
        ):
            listing.uncommitted.append(url)  # an empty one: a save killed before its marker, nothing to lose
        else:
            listing.foreign.append(url)
    listing.committed.sort(key=lambda c: c.manifest.step)
    return listing


def _torn_manifest(fs: fsspec.AbstractFileSystem, path: str) -> bool:
    """Whether the checkpoint directory *path* is blocks' own and its manifest empty: a commit killed as it wrote it.

    Such a save never finished (manifests are written whole now, but earlier versions wrote
    them in place): it is uncommitted, not a damaged checkpoint.
    """
    try:
        return fs.info(join(path, MANIFEST)).get("size") == 0 and bool(fs.exists(join(path, MARKER)))
    except FileNotFoundError:
        return False


def scan(directory: str) -> tuple[list[Committed], list[str]]:
    """Committed checkpoints in *directory* (oldest first) and the URLs of blocks' uncommitted ones."""
    listing = list_dir(directory)
    return listing.committed, listing.uncommitted


def remove(url: str) -> None:
    """Delete a checkpoint directory: its manifest first, its marker last.

    Cut short (a killed process), what is left is never taken as committed (no manifest) and
    is still blocks' own (the marker): the next save of that step replaces it instead of
    refusing a directory it cannot tell from a user's.
    """
    fs, root = url_to_fs(url)
    if not fs.exists(root):
        return
    if _is_link(fs, root):
        raise CheckpointError(
            f"{url} is a link: blocks deletes only the checkpoints it wrote, never through a link"
        )
    marker = join(root, MARKER)
    if not fs.exists(marker):
        begin(url)
    if fs.exists(join(root, MANIFEST)):
        fs.rm(join(root, MANIFEST))
    others = [path for path in fs.find(root) if path.rstrip("/") != marker]
    if others:
        fs.rm(others)
    fs.rm(root, recursive=True)


@dataclass(frozen=True)
class Candidates:
    """The checkpoints a job's restart or rollback may load (see :class:`blocks.checkpoint.resume.Start`).

    Attributes:
        job: the job's id: every checkpoint it saved (:attr:`Manifest.job`) is a candidate.
        lineage: URLs of the checkpoints it continues from its directory.
        foreign: URLs of the entries its directory held that are another run's: when damaged,
            they are not a reason to refuse a restart.
    """

    job: str
    lineage: frozenset[str]
    foreign: frozenset[str]

    def admit(self, committed: Committed) -> bool:
        """Whether *committed* is one of the job's own or of its lineage."""
        return committed.manifest.job == self.job or committed.url in self.lineage


def newest_valid(directory: str, candidates: Candidates | None = None) -> Committed | None:
    """The newest committed checkpoint whose files match its manifest; corrupt ones are skipped with a warning.

    *candidates* is as for :func:`find_valid`.
    """
    return find_valid(directory, candidates)[0]


def find_valid(directory: str, candidates: Candidates | None = None) -> tuple[Committed | None, list[str]]:
    """The newest verified checkpoint in *directory* (or None) and why each newer or damaged one was skipped.

    The reasons name every checkpoint that exists but cannot be used; an empty list with None
    means the directory holds no checkpoint at all. With *candidates*, only those it admits are
    considered, and another run's damaged entries are no reason.
    """
    listing = list_dir(directory)
    damaged = [
        (url, why) for url, why in listing.damaged if candidates is None or url not in candidates.foreign
    ]
    skipped = [reason for _, reason in damaged]
    for url, reason in damaged:
        log.warning("skipping checkpoint %s: %s", url, reason)
    for candidate in reversed(listing.committed):
        if candidates is not None and not candidates.admit(candidate):
            continue
        try:
            verify(candidate.url)
        except CheckpointError as exc:
            log.warning("skipping checkpoint %s: %s; falling back to an older one", candidate.url, exc)
            skipped.append(str(exc))
            continue
        return candidate, skipped
    return None, skipped


def to_delete(
    committed: Iterable[Committed],
    *,
    keep_last: int,
    keep_best: int = 0,
    monitor: str | None = None,
    mode: str = "min",
    protected: Iterable[str] = (),
    stale: Iterable[str] = (),
) -> list[str]:
    """URLs retention may delete: not among the newest ``keep_last``, the best ``keep_best``, or *protected*.

    The best are ranked by *monitor* in their manifests; a checkpoint without it (not measured
    at its step) or with NaN (which no value is better or worse than) is no candidate. The
    newest committed checkpoint is always kept. *stale* checkpoints are newer than the one this
    run started from: left behind by an earlier attempt that got further but could not
    be resumed from (corrupt, or ``resume=never``). They never count among the newest or the
    best (else each new checkpoint would be deleted right after it is written) and are deleted
    once this run has saved a checkpoint at or past their step.
    """
    stale_urls = set(stale)
    everything = sorted(committed, key=lambda c: c.manifest.step)
    ordered = [c for c in everything if c.url not in stale_urls]
    keep = {c.url for c in ordered[-max(1, keep_last) :]} | set(protected)
    if keep_best and monitor:
        scored = [c for c in ordered if not math.isnan(c.manifest.metrics.get(monitor, math.nan))]
        scored.sort(key=lambda c: c.manifest.metrics[monitor], reverse=mode == "max")
        keep |= {c.url for c in scored[:keep_best]}
    reached = ordered[-1].manifest.step if ordered else -1
    superseded = [c.url for c in everything if c.url in stale_urls and c.manifest.step <= reached]
    return [c.url for c in ordered if c.url not in keep] + superseded


NEUTRAL_DATA_FIELDS = {"test_fraction": 0, "test_samples": 0}
"""Data fields added later whose default leaves the training data unchanged: left out of the
digest at that default, so checkpoints written before the field existed still resume."""


def block_digests(config: Mapping[str, Any]) -> dict[str, str]:
    """sha256 of each entry of *config*: what a checkpoint must share with the run that resumes it.

    The ``data`` entry leaves out fields added later at their neutral defaults; the caller
    leaves out what a resume may change (see :func:`blocks.checkpoint.resume.job_digests`).
    """
    shaping = dict(config)
    if "data" in shaping:
        shaping["data"] = {
            k: v
            for k, v in dict(shaping["data"]).items()
            if not (k in NEUTRAL_DATA_FIELDS and v == NEUTRAL_DATA_FIELDS[k])
        }
    return {
        kind: hashlib.sha256(canonical_json(value).encode()).hexdigest() for kind, value in shaping.items()
    }


def canonical_json(value: Any) -> str:
    """*value* as the digests serialize it: a tuple as a list, an Enum by name (one based on str or int by its value, as JSON writes those), anything else JSON cannot write as its text.

    Frozen: a change of it changes the digest of every checkpoint saved before, which would no longer resume.
    """
    return json.dumps(value, sort_keys=True, default=_text)


def _text(value: Any) -> str:
    return value.name if isinstance(value, enum.Enum) else str(value)
