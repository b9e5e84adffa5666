"""Finding and reading the text files of a corpus (torch-free).

Local paths and globs are read with the standard library, matching what fsspec lists for
them (hidden files included), so that planning a run on local text does not import fsspec; any
other URL (``s3://``, ``memory://``, ``simplecache::...``) goes through fsspec.
"""

from __future__ import annotations

import functools
import glob
import os
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

DEFAULT_CORPUS_PACKAGE = "email"
"""The standard-library package whose sources form the default corpus: on every machine, no download."""

_LOCAL_PREFIX = "file://"


def default_corpus_glob() -> str:
    """A glob for the default corpus: the ``.py`` files of one standard-library package."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return str(stdlib / DEFAULT_CORPUS_PACKAGE / "**" / "*.py")


def _local_pattern(url: str) -> str | None:
    """The absolute local path or glob *url* names, or None when fsspec must list it."""
    if sys.version_info < (3, 11):  # pragma: no cover - glob cannot include hidden files before 3.11
        return None
    if url.startswith(_LOCAL_PREFIX):
        url = url[len(_LOCAL_PREFIX) :]
    elif "://" in url or "::" in url:
        return None
    return os.path.abspath(os.path.expanduser(url))


@functools.lru_cache(maxsize=16)
def _listing(url: str) -> tuple[AbstractFileSystem | None, tuple[str, ...]]:
    """The file system (None: local) and the sorted files a URL or glob names."""
    local = _local_pattern(url or default_corpus_glob())
    if local is not None:
        matches = glob.glob(local, recursive=True, include_hidden=True)  # type: ignore[call-arg,unused-ignore]
        return None, tuple(sorted(p for p in matches if os.path.isfile(p)))
    import fsspec

    fs, _, paths = fsspec.get_fs_token_paths(url)
    return fs, tuple(sorted(p for p in paths if fs.isfile(p)))


def corpus_files(url: str) -> tuple[str, ...]:
    """The sorted files a URL or glob names (empty tuple when none match)."""
    return _listing(url)[1]


def corpus_size_bytes(url: str) -> int:
    """Total bytes of the corpus, with one separator byte between files."""
    fs, files = _listing(url)
    if not files:
        return 0
    sizes = (os.path.getsize(f) for f in files) if fs is None else (int(fs.size(f)) for f in files)
    return sum(sizes) + len(files) - 1


@functools.lru_cache(maxsize=4)
def corpus_bytes(url: str) -> bytes:
    """The whole corpus as bytes, files joined by a newline in sorted path order."""
    fs, files = _listing(url)
    if fs is None:
        return b"\n".join(Path(f).read_bytes() for f in files)
    return b"\n".join(fs.cat_file(f) for f in files)


@functools.lru_cache(maxsize=4)
def corpus_digest(url: str) -> str:
    """XXH3-128 of :func:`corpus_bytes`: the corpus's content, wherever it is stored."""
    import xxhash

    return xxhash.xxh3_128_hexdigest(corpus_bytes(url))


@functools.lru_cache(maxsize=4)
def corpus_alphabet(url: str) -> str:
    """The sorted distinct characters of the corpus (its char-level vocabulary)."""
    return "".join(sorted(set(corpus_bytes(url).decode("utf-8", errors="replace"))))


def forget() -> None:
    """Drop what this process listed and read: the next call sees the files as they are now."""
    for cached in (_listing, corpus_bytes, corpus_digest, corpus_alphabet):
        cached.cache_clear()
