"""Storage checks for checkpoints: a write probe before training, and clear errors when storage fails (torch-free).

A read-only directory, a missing bucket or a full disk would otherwise surface only at the
first save, possibly after all of training. :func:`preflight_storage` writes and removes a
probe file at ``checkpoint.dir`` before any process trains; :func:`storage_errors` turns the
errors a save hits on full storage into one that names the key and the fix.
"""

from __future__ import annotations

import errno
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from blocks.checkpoint import store
from blocks.spec.errors import BlocksError, Problem

log = logging.getLogger(__name__)

PROBE_PREFIX = ".blocks-probe-"
_IN_MEMORY = ("memory://", "memory:")


def preflight_storage(url: str, world_size: int) -> None:
    """Write and remove a probe file at *url*; :class:`BlocksError` on ``checkpoint.dir`` if that fails.

    ``memory://`` lives in one process only: refused for a job of several processes (each
    would save into its own memory), warned about otherwise (the checkpoints end with the process).
    """
    if url.startswith(_IN_MEMORY):
        if world_size > 1:
            raise BlocksError(
                Problem(
                    "checkpoint.dir",
                    f"{url} is in the memory of one process; the {world_size} processes of this job "
                    "cannot share checkpoints there",
                    "point checkpoint.dir at a shared file system or object store (or leave it unset)",
                    check="checkpoint-storage",
                )
            )
        log.warning("checkpoint.dir=%s keeps checkpoints in memory: they are lost when the job ends", url)
    probe = store.join(url, f"{PROBE_PREFIX}{uuid.uuid4().hex}")
    try:
        fs, root = url_to_fs(url)
        if isinstance(fs, LocalFileSystem):
            fs.makedirs(root, exist_ok=True)
        _, probe_path = url_to_fs(probe)
        with fs.open(probe_path, "wb") as fh:
            fh.write(b"blocks checks that checkpoints can be written here\n")
        fs.rm(probe_path)
    except Exception as exc:
        raise unwritable(url, exc) from None


def unwritable(url: str, exc: BaseException) -> BlocksError:
    """The error for checkpoint storage at *url* that failed a write with *exc*."""
    return BlocksError(
        Problem(
            "checkpoint.dir",
            f"checkpoints cannot be written to {url}: {_describe(exc)}",
            "point checkpoint.dir at a writable location (check the path, bucket, credentials and "
            "free space), or turn saving off with checkpoint.enabled=false",
            check="checkpoint-storage",
        )
    )


def out_of_space(exc: BaseException) -> bool:
    """Whether *exc*, or an error it was raised from, is ``ENOSPC`` (torch wraps it in a RuntimeError)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        current = current.__cause__ or current.__context__
    return False


@contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Re-raise running out of space while writing the checkpoint *url* as a :class:`BlocksError`."""
    try:
        yield
    except Exception as exc:
        if not out_of_space(exc):
            raise
        raise BlocksError(
            Problem(
                "checkpoint.dir",
                f"no space left on device while writing the checkpoint {url}",
                "free space there or point checkpoint.dir at a larger file system; lower checkpoint.keep_last "
                "to keep fewer checkpoints",
                check="checkpoint-storage",
            )
        ) from None


def _describe(exc: BaseException) -> str:
    if out_of_space(exc):
        return "no space left on device"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, OSError) else text
