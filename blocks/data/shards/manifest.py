"""The manifest of a shard directory: what was prepared, from what, with which tokenizer (torch-free)."""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
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
    """

    file: str
    tokens: int

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
    """

    url: str
    tokenizer: str
    tokenizer_file: str
    vocab_size: int
    dtype: str
    documents: int
    splits: dict[str, tuple[Shard, ...]] = field(default_factory=dict)
    sources: tuple[dict[str, Any], ...] = ()

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
                "shards": [{"file": s.file, "tokens": s.tokens} for s in shards],
            }
            for name, shards in manifest.splits.items()
        },
        "sources": list(manifest.sources),
    }


def content_digest(manifest: Manifest) -> str:
    """sha256 of what the shards hold: the tokenizer, the shards of each split, each source's size and sha256.

    Where the shards or their sources are stored is left out: a copy of the same shards, or
    shards prepared from the same files elsewhere, has the same digest.
    """
    content = {key: value for key, value in manifest_json(manifest).items() if key != "sources"}
    content["sources"] = [[source.get("size"), source.get("sha256")] for source in manifest.sources]
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


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


def parse_manifest(url: str, raw: dict[str, Any]) -> Manifest:
    """A manifest from its JSON form; raises ``ValueError`` on another format."""
    if raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise ValueError(f"not a {FORMAT} v{VERSION} manifest")
    return Manifest(
        url=url,
        tokenizer=str(raw["tokenizer"]),
        tokenizer_file=str(raw.get("tokenizer_file", "")),
        vocab_size=int(raw["vocab_size"]),
        dtype=str(raw["dtype"]),
        documents=int(raw.get("documents", 0)),
        splits={
            name: tuple(Shard(plain_file_name(s["file"]), int(s["tokens"])) for s in split["shards"])
            for name, split in raw["splits"].items()
        },
        sources=tuple(raw.get("sources", ())),
    )


@functools.lru_cache(maxsize=8)
def read_manifest(url: str) -> Manifest:
    """The manifest of the shard directory *url* (cached per process).

    The one place planning reads the data set: a small JSON file, no token data. Raises
    :class:`BlocksError` naming ``data.path`` when it is missing or not a manifest.
    """
    path = f"{url.rstrip('/')}/{MANIFEST}"
    try:
        with fsspec.open(path, "rb") as handle:
            raw = json.loads(handle.read())
        return parse_manifest(url, raw)
    except FileNotFoundError:
        what = f"no {MANIFEST} in '{url}'"
    except Exception as exc:
        what = f"cannot read '{path}': {exc}"
    raise BlocksError(
        Problem(
            "data.path",
            what,
            f"prepare the shards first: blocks data prepare SOURCE {url or 'OUT'}",
            check="shard-manifest",
        )
    )
