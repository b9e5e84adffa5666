"""The manifest of a shard directory: what was prepared, from what, with which tokenizer (torch-free)."""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import fsspec

from blocks.spec.errors import BlocksError, Problem

MANIFEST = "manifest.json"
FORMAT = "blocks-token-shards"
VERSION = 1


@dataclass(frozen=True)
class Shard:
    """One token file of a split.

    Attributes:
        file: name of the file inside the shard directory.
        tokens: tokens it holds.
        sha256: sha256 of the file's bytes (empty in manifests written before it was recorded).
    """

    file: str
    tokens: int
    sha256: str = ""

    def samples(self, seq_len: int) -> int:
        """Windows of ``seq_len + 1`` tokens at stride ``seq_len`` inside this shard (none cross shards)."""
        return max(0, (self.tokens - 1) // seq_len) if seq_len > 0 else 0


@dataclass(frozen=True)
class Manifest:
    """What ``blocks data prepare`` wrote, as the plan and the reader need it.

    Attributes:
        url: the shard directory.
        tokenizer: ``byte``, ``bpe:VOCAB`` or the tokenizer file that was used.
        tokenizer_file: name of the saved tokenizer in the directory (empty at byte level).
        vocab_size: token ids are below this.
        dtype: numpy dtype of the token files (``uint16`` or ``uint32``).
        documents: documents read from the sources.
        splits: the shards of each split (``train``, ``val``).
        sources: url, size and sha256 of each source file.
        max_id: the largest token id in the shards (-1: not recorded).
    """

    url: str
    tokenizer: str
    tokenizer_file: str
    vocab_size: int
    dtype: str
    documents: int
    splits: dict[str, tuple[Shard, ...]] = field(default_factory=dict)
    sources: tuple[dict[str, Any], ...] = ()
    max_id: int = -1

    @property
    def itemsize(self) -> int:
        """Bytes per token in the files."""
        return 2 if self.dtype == "uint16" else 4

    def shards(self, split: str) -> tuple[Shard, ...]:
        """The shards of *split* (empty when it has none)."""
        return self.splits.get(split, ())

    def tokens(self, split: str | None = None) -> int:
        """Tokens of *split*, or of all splits."""
        names = [split] if split else list(self.splits)
        return sum(s.tokens for name in names for s in self.shards(name))

    def num_samples(self, split: str, seq_len: int) -> int:
        """Samples of ``seq_len`` tokens in *split*."""
        return sum(s.samples(seq_len) for s in self.shards(split))

    def largest_shard_bytes(self) -> int:
        """Size of the largest token file (what the cache must hold per shard)."""
        return max((s.tokens * self.itemsize for name in self.splits for s in self.shards(name)), default=0)


def sample_offsets(shards: tuple[Shard, ...], seq_len: int) -> list[int]:
    """Cumulative sample counts: shard ``i`` holds sample ids ``offsets[i]`` to ``offsets[i + 1] - 1``."""
    offsets = [0]
    for shard in shards:
        offsets.append(offsets[-1] + shard.samples(seq_len))
    return offsets


def locate(offsets: list[int], sample: int) -> tuple[int, int]:
    """``(shard index, window index inside it)`` of global sample id *sample*."""
    shard = bisect.bisect_right(offsets, sample) - 1
    return shard, sample - offsets[shard]


def manifest_json(manifest: Manifest) -> dict[str, Any]:
    """The manifest as written to ``manifest.json``."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": manifest.tokenizer,
        "tokenizer_file": manifest.tokenizer_file,
        "vocab_size": manifest.vocab_size,
        "dtype": manifest.dtype,
        "documents": manifest.documents,
        "tokens": manifest.tokens(),
        "splits": {
            name: {
                "tokens": manifest.tokens(name),
                "shards": [_shard_json(s) for s in shards],
            }
            for name, shards in manifest.splits.items()
        },
        "sources": list(manifest.sources),
        **({"max_id": manifest.max_id} if manifest.max_id >= 0 else {}),
    }


def _shard_json(shard: Shard) -> dict[str, Any]:
    return {"file": shard.file, "tokens": shard.tokens, **({"sha256": shard.sha256} if shard.sha256 else {})}


def content_digest(manifest: Manifest) -> str:
    """sha256 of what the shards hold: the tokenizer, the shards of each split, each source's size and sha256.

    Where the shards or their sources are stored is left out: a copy of the same shards, or
    shards prepared from the same files elsewhere, has the same digest.
    """
    content = {
        key: value for key, value in manifest_json(manifest).items() if key not in ("sources", "max_id")
    }
    for split in content["splits"].values():  # as digested before shards carried their sha256 (in their name)
        split["shards"] = [{"file": _unversioned(s["file"]), "tokens": s["tokens"]} for s in split["shards"]]
    content["sources"] = [[source.get("size"), source.get("sha256")] for source in manifest.sources]
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


_CONTENT_SUFFIX = re.compile(r"-[0-9a-f]{16}(?=\.bin$)")


def _unversioned(name: str) -> str:
    """A shard's file name without the content hash that names of shards prepared since carry (``-<16 hex>``)."""
    return _CONTENT_SUFFIX.sub("", name)


def plain_file_name(name: object) -> str:
    """*name* when it names a file inside the shard directory; raises ``ValueError`` otherwise.

    A manifest is read from storage that may not be yours: a shard named ``../x`` or ``/x``
    would be read, or fetched into the cache, outside the shard directory.
    """
    text = str(name)
    if (
        not text
        or text.startswith(".")
        or any(bad in text for bad in ("/", "\\", "\0"))
        or PurePosixPath(text).name != text
    ):
        raise ValueError(f"shard file name {text!r} is not a plain file name inside the shard directory")
    return text


DTYPES = {"uint16": 2, "uint32": 4}


class ManifestFieldError(ValueError):
    """A field of ``manifest.json`` that is missing or holds a value the reader cannot use."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"field '{field_name}' {problem}")
        self.field = field_name


def _count(raw: Any, field_name: str) -> int:
    """A non-negative whole number, or :class:`ManifestFieldError` naming *field_name*."""
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ManifestFieldError(field_name, f"is {raw!r}, not a whole number >= 0")
    return raw


def _get(raw: dict[str, Any], key: str, where: str = "") -> Any:
    if not isinstance(raw, dict) or key not in raw:
        raise ManifestFieldError(f"{where}{key}", "is missing")
    return raw[key]


def _shard(raw: Any, where: str) -> Shard:
    try:
        name = plain_file_name(_get(raw, "file", where))
    except ManifestFieldError:
        raise
    except ValueError as exc:
        raise ManifestFieldError(f"{where}file", str(exc)) from exc
    sha = raw.get("sha256", "")
    if not isinstance(sha, str):
        raise ManifestFieldError(f"{where}sha256", f"is {sha!r}, not a hex digest")
    return Shard(name, _count(_get(raw, "tokens", where), f"{where}tokens"), sha)


def parse_manifest(url: str, raw: dict[str, Any]) -> Manifest:
    """A manifest from its JSON form; raises ``ValueError`` (a :class:`ManifestFieldError` naming the field) otherwise.

    Only what the reader can use passes: token files of ``uint16`` or ``uint32``, token
    counts that are whole numbers >= 0, a vocabulary above every recorded token id.
    """
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise ValueError(f"not a {FORMAT} v{VERSION} manifest")
    dtype = _get(raw, "dtype")
    if dtype not in DTYPES:
        raise ManifestFieldError("dtype", f"is {dtype!r}; token files are uint16 or uint32")
    vocab = _get(raw, "vocab_size")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or not 0 < vocab <= 1 << (8 * DTYPES[dtype]):
        raise ManifestFieldError("vocab_size", f"is {vocab!r}, not a vocabulary that {dtype} ids can hold")
    max_id = raw.get("max_id", -1)
    if max_id != -1 and _count(max_id, "max_id") >= vocab:
        raise ManifestFieldError("vocab_size", f"is {vocab}, but the shards hold token id {max_id}")
    splits_raw = _get(raw, "splits")
    if not isinstance(splits_raw, dict):
        raise ManifestFieldError("splits", "is not a mapping of split names to shards")
    splits: dict[str, tuple[Shard, ...]] = {}
    for name, split in splits_raw.items():
        shards = _get(split, "shards", f"splits.{name}.")
        if not isinstance(shards, list):
            raise ManifestFieldError(f"splits.{name}.shards", "is not a list")
        splits[name] = tuple(_shard(s, f"splits.{name}.shards[{i}].") for i, s in enumerate(shards))
    sources = raw.get("sources", ())
    return Manifest(
        url=url,
        tokenizer=str(_get(raw, "tokenizer")),
        tokenizer_file=str(raw.get("tokenizer_file", "")),
        vocab_size=vocab,
        dtype=dtype,
        documents=_count(raw.get("documents", 0), "documents"),
        splits=splits,
        sources=tuple(sources) if isinstance(sources, list) else (),
        max_id=max_id,
    )


@functools.lru_cache(maxsize=8)
def read_manifest(url: str) -> Manifest:
    """The manifest of the shard directory *url* (cached per process).

    The one place planning reads the data set: a small JSON file, no token data. Raises
    :class:`BlocksError` naming ``data.path`` when it is missing or not a manifest.
    """
    path = f"{url.rstrip('/')}/{MANIFEST}"
    fix = f"check the URL and credentials for '{url}'"
    try:
        with fsspec.open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        what, fix = (
            f"no {MANIFEST} in '{url}'",
            f"prepare the shards first: blocks data prepare SOURCE {url or 'OUT'}",
        )
    except Exception as exc:
        what = f"cannot read '{path}': {type(exc).__name__}: {exc}"
    else:
        try:
            return parse_manifest(url, json.loads(data))
        except ValueError as exc:  # JSON errors are ValueErrors too
            what = f"'{path}' is not a usable manifest: {exc}"
            fix = f"prepare the shards again: blocks data prepare SOURCE {url}"
    raise BlocksError(Problem("data.path", what, fix, check="shard-manifest"))
