"""Finding and reading the text files of a corpus (torch-free).

Globs and remote URLs (``s3://``, ``memory://``, ``simplecache::...``) are listed by fsspec,
whose glob rules define what a pattern matches. Two cases that need no pattern matching are
read with the standard library, so that planning them does not import fsspec: the default
corpus (a walk that lists exactly what fsspec lists for :func:`default_corpus_glob`) and a
single local file.
"""

from __future__ import annotations

import functools
import os
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

DEFAULT_CORPUS_PACKAGE = "email"
"""The standard-library package whose sources form the default corpus: on every machine, no download."""

_LOCAL_PREFIX = "file://"


def _default_corpus_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]) / DEFAULT_CORPUS_PACKAGE


def default_corpus_glob() -> str:
    """A glob for the default corpus: the ``.py`` files of one standard-library package."""
    return str(_default_corpus_root() / "**" / "*.py")


def _default_corpus_files() -> tuple[str, ...]:
    """What fsspec lists for :func:`default_corpus_glob`: every ``.py`` file below, symlinked directories not followed."""
    found = []
    for directory, _, files in os.walk(_default_corpus_root()):
        found += [os.path.join(directory, name) for name in files if name.endswith(".py")]
    return tuple(sorted(found))


def _local_file(url: str) -> str | None:
    """The absolute path *url* names when it is one local path (no ``*``, no other file system), else None.

    fsspec takes a path without ``*`` literally (``?`` and ``[`` included); so does this.
    """
    if url.startswith(_LOCAL_PREFIX):
        url = url[len(_LOCAL_PREFIX) :]
    elif url.startswith("file:") or "://" in url or "::" in url:
        return None
    if "*" in url:
        return None
    return os.path.abspath(os.path.expanduser(url))


@functools.lru_cache(maxsize=16)
def _listing(url: str) -> tuple[AbstractFileSystem | None, tuple[str, ...]]:
    """The file system (None: local, read without fsspec) and the sorted files a URL or glob names."""
    if not url:
        return None, _default_corpus_files()
    local = _local_file(url)
    if local is not None:
        return None, (local,) if os.path.isfile(local) else ()
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
