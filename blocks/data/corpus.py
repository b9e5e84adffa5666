"""Finding and reading the text files of a corpus through fsspec (torch-free)."""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

import fsspec

DEFAULT_CORPUS_PACKAGE = "email"
"""The standard-library package whose sources form the default corpus: on every machine, no download."""


def default_corpus_glob() -> str:
    """A glob for the default corpus: the ``.py`` files of one standard-library package."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return str(stdlib / DEFAULT_CORPUS_PACKAGE / "**" / "*.py")


@functools.lru_cache(maxsize=16)
def corpus_files(url: str) -> tuple[fsspec.AbstractFileSystem, tuple[str, ...]]:
    """The file system and the sorted files a URL or glob names (empty tuple when none match)."""
    fs, _, paths = fsspec.get_fs_token_paths(url or default_corpus_glob())
    files = tuple(sorted(p for p in paths if fs.isfile(p)))
    return fs, files


def corpus_size_bytes(url: str) -> int:
    """Total bytes of the corpus, with one separator byte between files."""
    fs, files = corpus_files(url)
    if not files:
        return 0
    return sum(int(fs.size(f)) for f in files) + len(files) - 1


@functools.lru_cache(maxsize=4)
def corpus_bytes(url: str) -> bytes:
    """The whole corpus as bytes, files joined by a newline in sorted path order."""
    fs, files = corpus_files(url)
    return b"\n".join(fs.cat_file(f) for f in files)


@functools.lru_cache(maxsize=4)
def corpus_alphabet(url: str) -> str:
    """The sorted distinct characters of the corpus (its char-level vocabulary)."""
    return "".join(sorted(set(corpus_bytes(url).decode("utf-8", errors="replace"))))
