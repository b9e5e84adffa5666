"""``data=stream``: token shards made by ``blocks data prepare``, streamed from any fsspec URL."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from blocks.data.base import DataBlock, TokenBatch
from blocks.data.shards.cache import default_cache_dir, is_local
from blocks.data.shards.manifest import Manifest, content_digest, read_manifest
from blocks.spec.errors import BlocksError
from blocks.spec.registry import register

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from blocks.core.plan import CheckContext

GB = 10**9


@register("stream")
@dataclass(frozen=True, kw_only=True)
class Stream(DataBlock):
    """Next-token data from prepared token shards on any fsspec URL (local, ``s3://``), read as needed.

    The plan sizes the job from the shard directory's ``manifest.json`` alone. Training reads
    the shards through a local cache of at most ``cache_limit_gb``, fetching the next
    ``prefetch`` shards in the background. The order of an epoch comes from the seed: the
    shards are shuffled, then the samples within each group of ``shuffle_shards`` shards,
    so every sample is seen once per epoch at any world size and a resume continues at the
    exact sample.

    Attributes:
        path: the shard directory ``blocks data prepare`` wrote (fsspec URL).
        source: with ``path`` empty: files to prepare on first use (as ``blocks data prepare
            SOURCE``, e.g. ``python:email``) into the cache directory; later plans reuse them.
        tokenizer: with ``source``: ``byte``, ``bpe:VOCAB`` or a ``tokenizer.json`` path.
        seq_len: tokens per sample; each sample predicts its tokens shifted by one.
        shuffle_shards: shards whose samples are shuffled together (more mixes better, needs more cache).
        prefetch: shards fetched ahead in the background.
        cache_dir: where remote shards are cached (empty: ``$BLOCKS_CACHE_DIR`` or ``~/.cache/blocks/shards``).
        cache_limit_gb: most disk the fetched shards in ``cache_dir`` may use, all shard directories
            together (shards prepared from ``source`` are not counted).
    """

    reading_fields: ClassVar[tuple[str, ...]] = (
        *DataBlock.reading_fields,
        "prefetch",
        "cache_dir",
        "cache_limit_gb",
    )
    location_fields: ClassVar[tuple[str, ...]] = ("path", "source")

    path: str = ""
    source: str = ""
    tokenizer: str = "byte"
    seq_len: int = 128
    shuffle_shards: int = 4
    prefetch: int = 2
    cache_dir: str = ""
    cache_limit_gb: float = 10.0

    def shard_url(self) -> str:
        """The shard directory: ``path``, or where ``source`` is prepared in the cache directory."""
        if self.path:
            return self.path
        key = hashlib.sha256(f"{self.source}|{self.tokenizer}".encode()).hexdigest()[:16]
        return str(Path(self.resolved_cache_dir()) / "prepared" / key)

    def prepare(self) -> None:
        """With ``source`` and no ``path``: prepare the source into the cache (incrementally: unchanged sources are reused).

        Each plan reads the manifest afresh: shards prepared again since this process last
        read it (a notebook, a pipeline) are seen as they are now, and source files added,
        removed or edited since are prepared.
        """
        read_manifest.cache_clear()
        if not self.path and self.source:
            from blocks.data.shards.prepare import ensure_prepared

            try:
                ensure_prepared(self.source, self.shard_url(), self.tokenizer)
            except BlocksError as exc:  # said of blocks data prepare's SOURCE: here it is data.source
                raise BlocksError(
                    [
                        dataclasses.replace(p, key="data.source", check="data-source")
                        if p.key == "SOURCE"
                        else p
                        for p in exc.problems
                    ]
                ) from None

    def manifest(self) -> Manifest:
        """The shard directory's manifest (the only file planning reads; :meth:`prepare` writes it for ``source``)."""
        return read_manifest(self.shard_url())

    def content_digest(self) -> str:
        """A digest of what the shards hold (from their manifest: tokenizer, shards, sources' sha256)."""
        return content_digest(self.manifest())

    def batch_spec(self) -> TokenBatch:
        """Token windows of ``seq_len`` over the tokenizer's vocabulary."""
        return TokenBatch(vocab_size=self.manifest().vocab_size, seq_len=self.seq_len)

    def num_samples(self, split: str) -> int:
        """Windows of ``seq_len + 1`` tokens inside the shards of *split*."""
        return self.manifest().num_samples(split, self.seq_len)

    def resolved_cache_dir(self) -> str:
        """The cache directory in use."""
        return self.cache_dir or default_cache_dir()

    def build(self, split: str) -> Dataset:
        """The windows of *split*, read through the cache."""
        from blocks.data.shards.cache import ShardCache, shard_keys
        from blocks.data.shards.dataset import ShardWindows

        manifest = self.manifest()
        cache = ShardCache(
            self.shard_url(),
            self.resolved_cache_dir(),
            int(self.cache_limit_gb * GB),
            prefetch=self.prefetch,
            shards=shard_keys(manifest),
        )
        return ShardWindows(manifest, split, self.seq_len, cache, shuffle_shards=self.shuffle_shards)

    def preflight(self) -> None:
        """Before any process starts: every shard of the manifest is on the storage, of the size it says (raises otherwise)."""
        import fsspec

        from blocks.spec.errors import Problem

        manifest = self.manifest()
        url = self.shard_url()
        fs, root = fsspec.core.url_to_fs(url)
        try:
            present = {
                str(p["name"]).rstrip("/").rsplit("/", 1)[-1]: p.get("size") for p in fs.ls(root, detail=True)
            }
        except Exception as exc:
            raise BlocksError(
                Problem("data.path", f"cannot list '{url}': {exc}", "check the URL and credentials")
            ) from exc
        missing = [s.file for name in manifest.splits for s in manifest.shards(name) if s.file not in present]
        if missing:
            raise BlocksError(
                Problem(
                    "data.path",
                    f"{len(missing)} shard file(s) of the manifest are missing from '{url}', e.g. {missing[0]}",
                    f"rerun blocks data prepare SOURCE {url}",
                )
            )
        wrong = [
            (s.file, present[s.file], s.tokens * manifest.itemsize)
            for name in manifest.splits
            for s in manifest.shards(name)
            if present[s.file] is not None and present[s.file] != s.tokens * manifest.itemsize
        ]
        if wrong:
            file, size, expected = wrong[0]
            raise BlocksError(
                Problem(
                    "data.path",
                    f"{len(wrong)} shard file(s) in '{url}' differ in size from their manifest, e.g. {file} "
                    f"holds {size} bytes, not {expected} ({manifest.dtype} tokens)",
                    f"rerun blocks data prepare SOURCE {url}",
                )
            )

    def check(self, ctx: CheckContext) -> None:
        """The manifest must exist; the cache must be writable and hold the shards read at once."""
        super().check(ctx)
        ctx.positive("seq_len", self.seq_len)
        ctx.positive("shuffle_shards", self.shuffle_shards)
        ctx.positive("prefetch", self.prefetch, allow_zero=True)
        ctx.positive("cache_limit_gb", self.cache_limit_gb)
        if not self.path and not self.source:
            ctx.error(
                "path",
                "names no shard directory (and data.source names nothing to prepare)",
                "data.path=<the OUT of blocks data prepare SOURCE OUT>",
                check="shard-manifest",
            )
            return
        try:
            manifest = self.manifest()
        except BlocksError as exc:
            for problem in exc.problems:
                ctx.error("path", problem.message, problem.fix, check=problem.check)
            return
        if not manifest.shards("train"):
            ctx.error(
                "path", f"'{self.path}' has no training shards", "prepare more data", check="shard-manifest"
            )
        if is_local(self.shard_url()):
            return
        self._check_cache(ctx, manifest)

    def _check_cache(self, ctx: CheckContext, manifest: Manifest) -> None:
        """The cache directory is writable and its limit (and the free disk) holds the shards in use at once."""
        needed = (self.shuffle_shards + self.prefetch + 1) * manifest.largest_shard_bytes()
        if needed > self.cache_limit_gb * GB:
            ctx.error(
                "cache_limit_gb",
                f"{self.cache_limit_gb} GB cannot hold the {self.shuffle_shards + self.prefetch + 1} shards "
                f"read at once ({needed / GB:.3g} GB)",
                f"data.cache_limit_gb={needed / GB * 1.5:.3g} or lower data.shuffle_shards / data.prefetch",
                check="cache-room",
                related=("data.shuffle_shards", "data.prefetch"),
            )
        cache = Path(self.resolved_cache_dir())
        existing = next((p for p in (cache, *cache.parents) if p.exists()), None)
        if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK):
            ctx.error(
                "cache_dir",
                f"cannot write the shard cache at '{cache}'",
                "data.cache_dir=<a writable directory>",
                check="cache-writable",
            )
            return
        free = shutil.disk_usage(existing).free
        if free < needed:
            ctx.error(
                "cache_dir",
                f"'{existing}' has {free / GB:.3g} GB free, fewer than the {needed / GB:.3g} GB the cache needs",
                "data.cache_dir=<a disk with room>",
                check="cache-room",
            )
