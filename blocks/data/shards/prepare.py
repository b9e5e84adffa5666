"""``blocks data prepare``: text, JSON Lines or Parquet files → token shards and a manifest.

One worker process per source file at a time tokenizes it and writes its shards and a small
``parts/NNNNN.json`` record; a rerun skips the sources whose record matches (same file version,
tokenizer and options), so an interrupted prepare resumes. Shard files are named by their
content, so a prepare never rewrites a file the current manifest names; ``manifest.json`` is
replaced last, from the records, in one step, and only then are shard files it no longer
names removed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import multiprocessing
import os
import re
import sysconfig
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

from blocks.data.shards.manifest import MANIFEST, Manifest, Shard, manifest_json
from blocks.spec.errors import BlocksError, Problem

TOKENIZER_FILE = "tokenizer.json"
EOT = "<|endoftext|>"
BYTE_SEPARATOR = 10
"""At byte level documents are joined by a newline, as ``data=text`` joins its files."""
SHARD_NAME = re.compile(r"(train|val)-\d{5}-\d{3}(-[0-9a-f]{16})?\.bin")
"""Shard files a prepare writes (the unsuffixed ones by earlier versions); others in OUT are left alone."""
STDLIB_PREFIX = "python:"
"""``python:email`` names the sources of a standard-library package (no download)."""


@dataclass(frozen=True)
class PrepareOptions:
    """How ``blocks data prepare`` tokenizes and shards.

    Attributes:
        tokenizer: ``byte`` (256 ids, no tokenizer), ``bpe:VOCAB`` (a byte-level BPE trained
            on the sources) or the path/URL of a Hugging Face ``tokenizer.json``.
        val_fraction: share of each source's tokens, from its end, written to the val split.
        shard_tokens: most tokens per shard file.
        text_key: the field holding the text in JSON Lines and Parquet sources.
        workers: worker processes.
    """

    def shaping(self) -> dict[str, Any]:
        """The options that decide what the shards hold (all but ``tokenizer``, recorded by digest, and ``workers``)."""
        return {
            "val_fraction": self.val_fraction,
            "shard_tokens": self.shard_tokens,
            "text_key": self.text_key,
        }

    tokenizer: str = "byte"
    val_fraction: float = 0.1
    shard_tokens: int = 1 << 24
    text_key: str = "text"
    workers: int = 2


def source_files(source: str) -> list[str]:
    """The files SOURCE names, sorted: a file, a directory (recursively), a glob, or ``python:PACKAGE``, as URLs."""
    if source.startswith(STDLIB_PREFIX):
        package = source[len(STDLIB_PREFIX) :].replace(".", "/")
        source = str(Path(sysconfig.get_paths()["stdlib"]) / package / "**" / "*.py")
    fs, _, paths = fsspec.get_fs_token_paths(source)
    files: list[str] = []
    for path in paths:
        if fs.isdir(path):
            files.extend(p for p in fs.find(path) if not Path(p).name.startswith("."))
        elif fs.isfile(path):
            files.append(path)
    return [fs.unstrip_protocol(p) for p in sorted(set(files))]


def read_documents(url: str, text_key: str) -> Iterator[str]:
    """The documents of one source: the whole file, one per JSON line, or one per Parquet row."""
    name = url.rsplit("/", 1)[-1].lower()
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise BlocksError(
                Problem("SOURCE", f"{url} is Parquet, which needs pyarrow", "pip install pyarrow")
            ) from exc
        with fsspec.open(url, "rb") as handle:
            table = pq.read_table(handle, columns=[text_key])
        yield from (str(v) for v in table.column(text_key).to_pylist())
        return
    with fsspec.open(url, "rb") as handle:
        raw = handle.read()
    if name.endswith((".jsonl", ".ndjson")):
        for line in raw.splitlines():
            if line.strip():
                yield str(json.loads(line)[text_key])
    else:
        yield raw.decode("utf-8", errors="replace")


def train_bpe(sources: Sequence[str], vocab_size: int, text_key: str) -> str:
    """A byte-level BPE tokenizer trained on the sources, as ``tokenizer.json`` text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    docs = (doc for url in sources for doc in read_documents(url, text_key))
    tokenizer.train_from_iterator(docs, trainer=trainer)
    return str(tokenizer.to_str())


def _tokenizer_json(spec: str, out: str, sources: Sequence[str], text_key: str) -> str | None:
    """The tokenizer's JSON (``None`` at byte level): reused from OUT, trained, or read from the user's file."""
    if spec == "byte":
        return None
    if importlib.util.find_spec("tokenizers") is None:
        raise BlocksError(
            Problem(
                "--tokenizer",
                f"'{spec}' needs Hugging Face tokenizers, which is not installed",
                "pip install 'blocks[stream]', or --tokenizer byte",
            )
        )
    saved = f"{out}/{TOKENIZER_FILE}"
    state = _read_json(f"{out}/prepare.json") or {}
    fs, path = fsspec.core.url_to_fs(saved)
    if spec.startswith("bpe:") and state.get("tokenizer") == spec and fs.exists(path):
        return str(
            fs.cat_file(path).decode()
        )  # trained once; a tokenizer file is read each time (it may change)
    if spec.startswith("bpe:"):
        try:
            vocab = int(spec[4:])
        except ValueError:
            vocab = 0
        if vocab < 257:
            raise BlocksError(
                Problem("--tokenizer", f"'{spec}' needs a vocabulary above 256", "--tokenizer bpe:4096")
            )
        text = train_bpe(sources, vocab, text_key)
    else:
        try:
            with fsspec.open(spec, "rb") as handle:
                text = handle.read().decode()
        except FileNotFoundError as exc:
            raise BlocksError(
                Problem(
                    "--tokenizer",
                    f"no tokenizer file '{spec}'",
                    "--tokenizer byte, --tokenizer bpe:4096, or the path of a tokenizer.json",
                )
            ) from exc
    if not (fs.exists(path) and fs.cat_file(path).decode() == text):
        _write_atomic(saved, text.encode())
    return text


def _read_json(url: str) -> Any:
    try:
        with fsspec.open(url, "rb") as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        return None


def _write_json(url: str, value: Any) -> None:
    _write_atomic(url, json.dumps(value, indent=1).encode())


def _write_atomic(url: str, data: bytes) -> None:
    """Write *url* so that a reader sees the old file or the new one, never part of it.

    Local files go through a temporary name in the same folder and a rename; an object
    store's single put is atomic.
    """
    fs, path = fsspec.core.url_to_fs(url)
    if "file" not in fs.protocol and "local" not in fs.protocol:
        fs.pipe_file(path, data)
        return
    import tempfile

    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def fingerprint(url: str) -> str:
    """What identifies a source's version without reading it (size plus ETag or modification time)."""
    fs, path = fsspec.core.url_to_fs(url)
    info = fs.info(path)
    stamp = info.get("ETag") or info.get("mtime") or info.get("LastModified") or ""
    return f"{info.get('size')}:{stamp}"


@dataclass(frozen=True)
class _Job:
    index: int
    source: str
    out: str
    tokenizer: str | None
    tokenizer_digest: str
    options: PrepareOptions


def _tokens(job: _Job) -> tuple[Any, int, str, int]:
    """The source's tokens, its document count, content sha256 and size."""
    import numpy as np

    digest = hashlib.sha256()
    size = 0
    chunks: list[Any] = []
    docs = 0
    tokenizer = None
    if job.tokenizer is not None:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(job.tokenizer)
        eot = tokenizer.token_to_id(EOT)
    for doc in read_documents(job.source, job.options.text_key):
        data = doc.encode("utf-8")
        digest.update(data)
        size += len(data)
        docs += 1
        if tokenizer is None:
            chunks.append(np.frombuffer(data + bytes([BYTE_SEPARATOR]), dtype=np.uint8).astype(np.uint32))
        else:
            ids = tokenizer.encode(doc).ids
            chunks.append(np.asarray([*ids] + ([eot] if eot is not None else []), dtype=np.uint32))
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint32)
    return tokens, docs, digest.hexdigest(), size


def prepare_source(job: _Job) -> dict[str, Any]:
    """Tokenize one source, write its shards and its ``parts`` record; returns the record.

    A shard file is named by its content's sha256: it never replaces a file of another content
    (one a manifest names, one a running job has mapped), and one already there is kept.
    """
    import numpy as np

    dtype = "uint16" if _vocab_size(job.tokenizer) <= 1 << 16 else "uint32"
    fingerprinted = fingerprint(job.source)  # before reading: an edit while reading is seen next time
    tokens, docs, sha, size = _tokens(job)
    val = int(len(tokens) * job.options.val_fraction)
    record: dict[str, Any] = {
        "source": job.source,
        "fingerprint": fingerprinted,
        "tokenizer": job.tokenizer_digest,
        "options": job.options.shaping(),
        "size": size,
        "sha256": sha,
        "documents": docs,
        "max_id": int(tokens.max()) if len(tokens) else -1,
        "splits": {},
    }
    fs, _ = fsspec.core.url_to_fs(job.out)
    for split, part in (("train", tokens[: len(tokens) - val]), ("val", tokens[len(tokens) - val :])):
        shards = []
        for n, begin in enumerate(range(0, len(part), job.options.shard_tokens)):
            data = part[begin : begin + job.options.shard_tokens].astype(dtype).tobytes()
            digest = hashlib.sha256(data).hexdigest()
            name = f"{split}-{job.index:05d}-{n:03d}-{digest[:16]}.bin"
            _, path = fsspec.core.url_to_fs(f"{job.out}/{name}")
            if not (fs.exists(path) and fs.size(path) == len(data)):
                _write_atomic(f"{job.out}/{name}", data)
            shards.append({"file": name, "tokens": len(data) // np.dtype(dtype).itemsize, "sha256": digest})
        record["splits"][split] = shards
    _write_json(f"{job.out}/parts/{job.index:05d}.json", record)
    return record


def _vocab_size(tokenizer: str | None) -> int:
    if tokenizer is None:
        return 256
    return int(max(_vocab_of(tokenizer), 1))


def _vocab_of(tokenizer_json: str) -> int:
    from tokenizers import Tokenizer

    return int(Tokenizer.from_str(tokenizer_json).get_vocab_size(with_added_tokens=True))


def prepare(
    source: str,
    out: str,
    options: PrepareOptions,
    *,
    progress: bool = True,
    legacy_options: bool = False,
    keep_previous: bool = False,
) -> Manifest:
    """Prepare the shards of SOURCE in OUT (resuming a previous, interrupted prepare) and return the manifest.

    *legacy_options*: a ``parts`` record written before records held their options was made
    with *options* (true where they never vary, as for ``data.source``); otherwise its source
    is prepared again, since it may have been made with others. *keep_previous*: the shards of
    the manifest this one replaces stay until the next change (``data.source``, which any plan
    may prepare again while a job still reads the previous shards); otherwise only the new
    manifest's shards stay.
    """
    sources = source_files(source)
    if not sources:
        raise BlocksError(
            Problem(
                "SOURCE", f"no files match '{source}'", "name a file, a directory, a glob or python:email"
            )
        )
    out = out.rstrip("/")
    fs, path = fsspec.core.url_to_fs(out)
    fs.makedirs(path, exist_ok=True)
    tokenizer = _tokenizer_json(options.tokenizer, out, sources, options.text_key)
    tok_digest = "byte" if tokenizer is None else hashlib.sha256(tokenizer.encode()).hexdigest()
    records: dict[int, dict[str, Any]] = {}
    todo: list[_Job] = []
    for index, url in enumerate(sources):
        done = _read_json(f"{out}/parts/{index:05d}.json")
        if (
            done
            and done["source"] == url
            and done["tokenizer"] == tok_digest
            and done.get("options", options.shaping() if legacy_options else None) == options.shaping()
            and done["fingerprint"] == fingerprint(url)
        ):
            records[index] = done
        else:
            todo.append(_Job(index, url, out, tokenizer, tok_digest, options))
    _run_jobs(todo, records, options.workers, progress=progress)
    vocab = _vocab_size(tokenizer)
    ordered = [records[i] for i in range(len(sources))]
    manifest = Manifest(
        url=out,
        tokenizer=options.tokenizer,
        tokenizer_file=TOKENIZER_FILE if tokenizer is not None else "",
        vocab_size=vocab,
        dtype="uint16" if vocab <= 1 << 16 else "uint32",
        documents=sum(r["documents"] for r in ordered),
        splits={
            split: tuple(
                Shard(s["file"], s["tokens"], s.get("sha256", ""))
                for r in ordered
                for s in r["splits"][split]
            )
            for split in ("train", "val")
        },
        sources=tuple({"url": r["source"], "size": r["size"], "sha256": r["sha256"]} for r in ordered),
        max_id=-1
        if any("max_id" not in r for r in ordered)
        else max((r["max_id"] for r in ordered), default=-1),
    )
    before, recorded = _read_json(f"{out}/{MANIFEST}"), _read_json(f"{out}/prepare.json")
    changed = before != manifest_json(manifest)
    kept: list[str] = []
    if keep_previous:
        kept = _shard_files(before) if changed else list(recorded.get("previous_shards", []))
    state = {"tokenizer": options.tokenizer, "tokenizer_sha256": tok_digest, **options.shaping()}
    if kept:
        state["previous_shards"] = kept
    if recorded != state:
        _write_json(f"{out}/prepare.json", state)
    if changed:
        _write_json(f"{out}/{MANIFEST}", manifest_json(manifest))
    _remove_stale_shards(out, manifest, keep=kept)
    return manifest


def _shard_files(raw: dict[str, Any]) -> list[str]:
    """The shard file names a manifest's JSON names (none for an empty or malformed one)."""
    try:
        return sorted(str(s["file"]) for split in raw.get("splits", {}).values() for s in split["shards"])
    except (AttributeError, KeyError, TypeError):
        return []


def _remove_stale_shards(out: str, manifest: Manifest, keep: Collection[str] = ()) -> None:
    """Remove the shard files in OUT that neither *manifest* (already in place) nor *keep* names.

    A job still reading an earlier manifest keeps the files it has mapped (or cached); one that
    has not fetched a removed file yet stops with an error saying the file is gone.
    """
    fs, path = fsspec.core.url_to_fs(out)
    named = {s.file for split in manifest.splits for s in manifest.shards(split)} | set(keep)
    stale = [
        p
        for p in fs.ls(path, detail=False)
        if SHARD_NAME.fullmatch(p.rsplit("/", 1)[-1]) and p.rsplit("/", 1)[-1] not in named
    ]
    if stale:
        fs.rm(stale)


def _run_jobs(todo: list[_Job], records: dict[int, dict[str, Any]], workers: int, *, progress: bool) -> None:
    """Run the jobs in worker processes, with a progress bar on stderr."""
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), disable=not progress, transient=False) as bar:
        task = bar.add_task("tokenizing sources", total=len(todo))
        if workers <= 1 or len(todo) <= 1:
            for job in todo:
                records[job.index] = prepare_source(job)
                bar.advance(task)
            return
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {pool.submit(prepare_source, job): job.index for job in todo}
            for future in as_completed(futures):
                records[futures[future]] = future.result()
                bar.advance(task)


def ensure_prepared(source: str, out: str, tokenizer: str) -> Manifest:
    """The manifest in local directory *out*, after preparing what changed in *source* there.

    An incremental :func:`prepare`: sources whose record matches (same file version, tokenizer
    and options) are skipped, so a plan with nothing new reads a few small files. A file lock
    keeps concurrent planners from preparing the same directory twice.
    """
    import fcntl

    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        options = PrepareOptions(tokenizer=tokenizer)
        return prepare(source, out, options, progress=False, legacy_options=True, keep_previous=True)
