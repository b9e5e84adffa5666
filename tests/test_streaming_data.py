"""data=stream and ``blocks data prepare``: token shards on local disk and on an S3-protocol server.

Exactly-once per epoch at 1, 2 and 3 ranks, resumable prepare, a torch-free plan of a
10-billion-token manifest, plan-time checks, and a 2-process DDP run from ``s3://`` killed
with SIGKILL and rerun to the uninterrupted run's digest and metrics.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import string
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from blocks.core import jobs
from blocks.data.shards.cache import ShardCache
from blocks.data.shards.manifest import MANIFEST, Manifest, Shard, manifest_json, read_manifest
from blocks.data.shards.prepare import PrepareOptions, prepare
from blocks.data.stream import Stream
from blocks.runtime.sampler import GlobalBatchSampler
from blocks.spec.errors import BlocksError
from tests.conftest import blocks_run_until_step, moto_s3_server, read_summary, run_in_process

pytestmark = pytest.mark.timeout(600)

SEQ_LEN = 4


def write_corpus(root: Path, files: int = 6, chars: int = 64) -> Path:
    """*files* text files of random letters: every window of the corpus is distinct."""
    picker = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"doc{i}.txt").write_text("".join(picker.choices(string.ascii_letters, k=chars)))
    return root


@pytest.fixture(scope="module")
def byte_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Byte-level shards of 25 tokens: each 65-token source (64 letters + separator) gives 15 samples, 90 in all."""
    root = tmp_path_factory.mktemp("byte")
    out = root / "shards"
    prepare(
        str(write_corpus(root / "corpus")),
        str(out),
        PrepareOptions(val_fraction=0, shard_tokens=25, workers=2),
    )
    return out


def epoch_global_batches(dataset, world_size: int, global_batch: int, seed: int = 7) -> list[list[int]]:
    """Each optimizer step's global batch, assembled from every rank's micro-batches of one epoch."""
    ranks = []
    for rank in range(world_size):
        batches = GlobalBatchSampler(
            dataset.epoch_order(seed),
            micro_batch=global_batch // world_size,
            accumulate=1,
            rank=rank,
            world_size=world_size,
        )
        ranks.append(list(batches))
    return [[i for r in range(world_size) for i in ranks[r][step]] for step in range(len(ranks[0]))]


def test_one_epoch_reads_every_sample_once_on_1_2_and_3_ranks(byte_shards: Path) -> None:
    block = Stream(path=str(byte_shards), seq_len=SEQ_LEN, shuffle_shards=2)
    dataset = block.build("train")
    assert len(dataset) == block.num_samples("train") == 90
    streams = {world: epoch_global_batches(dataset, world, global_batch=6) for world in (1, 2, 3)}
    for world, steps in streams.items():
        seen = [i for step in steps for i in step]
        assert sorted(seen) == list(range(90)), f"world size {world}"
    assert streams[1] == streams[2] == streams[3], "the global batch stream depends on the world size"
    # The ids are the corpus's windows: every window of every source, each read once.
    corpus = sorted((byte_shards.parent / "corpus").iterdir())
    expected = []
    for path in corpus:
        tokens = path.read_bytes() + b"\n"
        for begin in range(0, len(tokens), 25):
            shard = tokens[begin : begin + 25]
            expected += [shard[s : s + SEQ_LEN + 1] for s in range(0, len(shard) - SEQ_LEN, SEQ_LEN)]
    read = [bytes(dataset.gather(step)["inputs"][k].tolist()) for step in streams[2] for k in range(6)]
    assert sorted(read) == sorted(w[:-1] for w in expected)


def test_the_order_changes_per_epoch_and_mixes_only_a_window_of_shards(byte_shards: Path) -> None:
    dataset = Stream(path=str(byte_shards), seq_len=SEQ_LEN, shuffle_shards=2).build("train")
    order = dataset.epoch_order(3)
    first = order.indices()
    order.set_epoch(1)
    assert order.indices() != first and sorted(order.indices()) == sorted(first)
    # Shards hold 3 or 6 samples: the first 6 of the epoch come from the first window of two shards.
    shards = {
        next(s for s in range(len(dataset.offsets) - 1) if dataset.offsets[s + 1] > i) for i in first[:6]
    }
    assert len(shards) <= 2


def test_prepare_is_resumable_and_records_the_sources(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus", files=4, chars=300)
    (corpus / "more.jsonl").write_text(
        "".join(json.dumps({"body": f"document {i} " * 20}) + "\n" for i in range(5))
    )
    out = tmp_path / "shards"
    options = PrepareOptions(tokenizer="bpe:300", shard_tokens=64, text_key="body", workers=2)
    first = prepare(str(corpus), str(out), options, progress=False)
    assert first.vocab_size == 300 and first.documents == 4 + 5
    by_url = {Path(s["url"]).name: s for s in first.sources}
    assert by_url["doc0.txt"]["sha256"] == hashlib.sha256((corpus / "doc0.txt").read_bytes()).hexdigest()
    raw = json.loads((out / MANIFEST).read_text())
    assert raw["tokens"] == first.tokens() > 0 and raw["tokenizer"] == "bpe:300"
    # An interrupted prepare: one source's record and a shard are gone; the rerun redoes that source only.
    (out / "parts" / "00001.json").unlink()
    (lost,) = out.glob("train-00001-000-*.bin")
    lost.unlink()
    (other,) = out.glob("train-00002-000-*.bin")
    kept = other.stat().st_mtime_ns
    again = prepare(str(corpus), str(out), options, progress=False)
    assert other.stat().st_mtime_ns == kept
    assert lost.exists()
    assert manifest_json(again) == manifest_json(first)
    # A tokenizer file from the user's project tokenizes the same way.
    reused = prepare(
        str(corpus),
        str(tmp_path / "reused"),
        PrepareOptions(tokenizer=str(out / "tokenizer.json"), shard_tokens=64, text_key="body", workers=1),
        progress=False,
    )
    assert reused.splits == first.splits and reused.vocab_size == 300


def test_the_content_digest_follows_the_sources_not_where_the_shards_are(
    byte_shards: Path, tmp_path: Path
) -> None:

    digest = Stream(path=str(byte_shards)).content_digest()
    shutil.copytree(byte_shards, tmp_path / "copy")
    assert Stream(path=str(tmp_path / "copy")).content_digest() == digest  # a resume may read a copy
    corpus = write_corpus(tmp_path / "corpus")  # the corpus of byte_shards, with one letter changed
    edited = corpus / "doc0.txt"
    edited.write_text(edited.read_text().swapcase()[:1] + edited.read_text()[1:])
    other = prepare(
        str(corpus), str(tmp_path / "other"), PrepareOptions(val_fraction=0, shard_tokens=25, workers=1)
    )
    same = read_manifest(str(byte_shards))  # the same token counts
    assert [s.tokens for s in other.shards("train")] == [s.tokens for s in same.shards("train")]
    assert Stream(path=str(tmp_path / "other")).content_digest() != digest


def test_prepare_command_and_its_mistakes(cli_in_process, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus", files=2)
    done = cli_in_process("data", "prepare", str(corpus), str(tmp_path / "out"), "--workers", "1", apart=True)
    assert done.returncode == 0, done.output[-3000:]
    assert "prepared" in done.stdout and (tmp_path / "out" / MANIFEST).exists()
    bad = cli_in_process(
        "data", "prepare", str(corpus), str(tmp_path / "bad"), "--tokenizer", "missing.json", apart=True
    )
    assert bad.returncode == 2 and "Traceback" not in bad.output
    assert "--tokenizer" in bad.stderr and "no tokenizer file" in bad.stderr
    empty = cli_in_process(
        "data", "prepare", str(tmp_path / "nothing-here"), str(tmp_path / "bad"), apart=True
    )
    assert empty.returncode == 2 and "no files match" in empty.stderr


def big_manifest(root: Path, *, shards: int = 10_000, tokens: int = 1_000_000, vocab: int = 50_257) -> Path:
    """A manifest of 10 billion tokens, and no data."""
    manifest = Manifest(
        url=str(root),
        tokenizer="gpt2.json",
        tokenizer_file="tokenizer.json",
        vocab_size=vocab,
        dtype="uint16",
        documents=shards,
        splits={
            "train": tuple(Shard(f"train-{i:05d}.bin", tokens) for i in range(shards)),
            "val": (Shard("val-00000.bin", tokens),),
        },
    )
    root.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).write_text(json.dumps(manifest_json(manifest)))
    return root


BIG = ["recipe=tiny_lm", "data=stream", "data.seq_len=1024", "model.context=1024", "trainer.max_epochs=1"]


def test_a_stream_resume_may_change_how_shards_are_read_but_not_what_they_hold(tmp_path: Path) -> None:
    import dataclasses

    from blocks.checkpoint import store
    from blocks.launch import driver

    corpus, shards = write_corpus(tmp_path / "corpus"), tmp_path / "shards"
    options = PrepareOptions(val_fraction=0, shard_tokens=25, workers=1)
    prepare(str(corpus), str(shards), options, progress=False)
    args = [
        "recipe=tiny_lm",
        "data=stream",
        f"data.path={shards}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.seq_len=4",
        "model.context=4",
        "data.batch_size=4",
        "trainer.val_every=null",
        "checkpoint.every_n_steps=1",
        "monitor.progress=off",
    ]
    run_dir = tmp_path / "run"
    assert driver.run([*args, "trainer.max_steps=2"], run_dir).status == "completed"

    def resume(*changes: str, steps: int) -> object:
        return run_in_process(
            ["run", *args, *changes, f"trainer.max_steps={steps}", f"hydra.run.dir={run_dir}"], cwd=tmp_path
        )

    # More cache, another cache directory, less prefetch: the same samples in the same order.
    reading = ["data.cache_limit_gb=2", f"data.cache_dir={tmp_path / 'other'}", "data.prefetch=1"]
    result = resume(*reading, steps=3)
    assert result.returncode == 0, result.output[-3000:]
    assert read_summary(run_dir)["resumed_from"].endswith(store.step_dir_name(2))
    # A checkpoint saved before reading fields were left out digested them with the rest (but batch size, workers).
    newest = store.scan(str(run_dir / "checkpoints"))[0][-1]
    manifest = json.loads(Path(newest.url, store.MANIFEST).read_text())
    every_field = dataclasses.asdict(jobs.plan([*args, *reading]).data)
    legacy = {
        "_block_": "stream",
        **{k: v for k, v in every_field.items() if k not in ("batch_size", "num_workers")},
    }
    manifest["block_digests"]["data"] = store.block_digests({"data": legacy})["data"]
    Path(newest.url, store.MANIFEST).write_text(json.dumps(manifest))
    result = resume(*reading, steps=4)
    assert result.returncode == 0, result.output[-3000:]
    # What the samples are counts: another sequence length, or shards prepared again from an edited corpus.
    result = resume("data.seq_len=2", steps=5)
    assert result.returncode == 2 and "different data" in result.output
    edited = corpus / "doc0.txt"
    edited.write_text(edited.read_text().swapcase())
    prepare(str(corpus), str(tmp_path / "again"), options, progress=False)
    shutil.rmtree(shards)
    (tmp_path / "again").rename(shards)  # the same path and token counts
    result = resume(steps=5)
    assert result.returncode == 2 and "different data content" in result.output, result.output[-2000:]
    # A checkpoint saved before the content was compared is not held to it.
    newest = store.scan(str(run_dir / "checkpoints"))[0][-1]
    manifest = json.loads(Path(newest.url, store.MANIFEST).read_text())
    for key in ("optim", "seed", "data_content"):
        del manifest["block_digests"][key]
    Path(newest.url, store.MANIFEST).write_text(json.dumps(manifest))
    result = resume("trainer.seed=7", steps=5)
    assert result.returncode == 0, result.output[-3000:]


def test_a_10_billion_token_manifest_plans_torch_free(tmp_path: Path) -> None:
    root = big_manifest(tmp_path / "big")
    overrides = [*BIG, f"data.path={root}", "trainer.max_steps=null"]
    script = (
        "import json, sys\n"
        "from blocks.core import jobs\n"
        f"plan = jobs.plan({overrides!r})\n"
        "d = plan.derived\n"
        "print(json.dumps({'ok': plan.ok, 'problems': [p.render() for p in plan.problems], 'steps': d.steps_per_epoch,"
        " 'tokens': d.total_tokens, 'samples': d.train_samples, 'torch': 'torch' in sys.modules}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    samples = 10_000 * ((1_000_000 - 1) // 1024)
    assert result["ok"], result["problems"]
    assert result["samples"] == samples and result["steps"] == samples // 16
    assert result["tokens"] == samples // 16 * 16 * 1024
    assert result["torch"] is False
    shown = run_in_process(["plan", *overrides], cwd=tmp_path, apart=True)  # torch-free: the subprocess above
    assert shown.returncode == 0, shown.output[-2000:]
    assert f"{samples // 16:,}" in shown.stdout and f"{samples // 16 * 16 * 1024:,}" in shown.stdout


def test_plan_checks_vocabulary_context_batch_and_manifest(tmp_path: Path) -> None:
    root = big_manifest(tmp_path / "small", shards=2, tokens=5000)
    checks = {
        "vocab-size": [*BIG, f"data.path={root}", "model.vocab_size=1000"],
        "seq-len-context": [*BIG, f"data.path={root}", "model.context=512"],
        "global-batch-fits-data": [*BIG, f"data.path={root}", "data.batch_size=16"],
        "shard-manifest": [*BIG, f"data.path={tmp_path / 'absent'}"],
    }
    for check, overrides in checks.items():
        plan = jobs.plan(overrides)
        assert check in {p.check for p in plan.errors}, (check, [p.render() for p in plan.problems])
    missing = run_in_process(["plan", *checks["shard-manifest"]], cwd=tmp_path)
    assert (
        missing.returncode == 2 and "data.path" in missing.output and "blocks data prepare" in missing.output
    )


# --- against an S3-protocol server -------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """moto's standalone S3 server for this module, with the environment that points s3fs (and children) at it."""
    import fsspec

    with pytest.MonkeyPatch.context() as patch, moto_s3_server() as env:
        for key, value in env.items():
            patch.setenv(key, value)
        patch.setitem(fsspec.config.conf, "s3", {"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"]})
        import s3fs

        fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"])
        fs.mkdir("stream")
        url = "s3://stream/email"
        prepare(
            "python:email",
            url,
            PrepareOptions(tokenizer="bpe:512", shard_tokens=2048, workers=2),
            progress=False,
        )
        yield fs, url, tmp_path_factory.mktemp("s3work")


def test_a_prefetch_that_finishes_at_once_never_deadlocks_the_reader(tmp_path: Path) -> None:
    """A fetch can finish before its callback is registered: the file appeared (another rank
    fetched it into the shared cache) or the read failed at once. Its callback then runs in the
    reader's own thread; if the reader still held the cache lock, training stopped for good (a
    2-process DDP job from S3 hung until its timeout). A fresh pool starts its thread inside
    ``submit``, which gives the new thread the first go: most fresh caches finish the fetch there.
    """
    for trial in range(20):
        cache = ShardCache("memory://blocks-nowhere", str(tmp_path / f"cache{trial}"), limit_bytes=10**6)
        reader = threading.Thread(target=cache.fetch_ahead, args=(["missing.bin"],), daemon=True)
        reader.start()
        reader.join(timeout=30)
        assert not reader.is_alive(), f"fetch_ahead deadlocked on fresh cache {trial}"
        with pytest.raises(FileNotFoundError):
            cache.path("missing.bin")


def test_s3_shards_read_through_a_small_cache_equal_a_local_copy(s3, tmp_path: Path) -> None:
    fs, url, _ = s3
    local = tmp_path / "local"
    fs.get(url.removeprefix("s3://"), str(local), recursive=True)
    manifest = read_manifest(url)
    assert manifest.vocab_size == 512 and len(manifest.shards("train")) > 10
    limit = 6 * manifest.largest_shard_bytes()
    cache = tmp_path / "cache"
    remote = Stream(path=url, seq_len=32, shuffle_shards=2, cache_dir=str(cache), cache_limit_gb=limit / 1e9)
    assert jobs.plan(["recipe=tiny_lm", "data=stream", f"data.path={url}", f"data.cache_dir={cache}"]).ok
    streamed = remote.build("train")
    copied = Stream(path=str(local), seq_len=32).build("train")
    order = streamed.epoch_order(0).indices()
    for begin in range(0, len(order), 64):
        batch = order[begin : begin + 64]
        assert streamed.gather(batch)["inputs"].equal(copied.gather(batch)["inputs"])
    cached = [p for p in cache.rglob("*.bin")]
    assert sum(p.stat().st_size for p in cached) <= limit
    too_small = jobs.plan(["recipe=tiny_lm", "data=stream", f"data.path={url}", "data.cache_limit_gb=1e-6"])
    assert "cache-room" in {p.check for p in too_small.errors}


def test_run_refuses_shards_missing_from_storage_before_starting(s3) -> None:
    fs, url, work = s3
    fs.copy(f"{url.removeprefix('s3://')}/{MANIFEST}", f"stream/manifest-only/{MANIFEST}")
    result = run_in_process(  # refused before anything starts
        [
            "run",
            "recipe=tiny_lm",
            "data=stream",
            "data.path=s3://stream/manifest-only",
            f"hydra.run.dir={work / 'x'}",
        ],
        cwd=work,
        apart=True,
    )
    assert result.returncode == 2 and "Traceback" not in result.output
    assert "shard file(s) of the manifest are missing" in result.stderr


def test_a_manifest_cannot_name_a_shard_outside_its_directory(s3, tmp_path: Path) -> None:
    """A shard named ``../../x`` by a manifest on storage that is not yours was fetched to
    ``<cache>/<hash>/../../x``: a file of the storage's choosing written outside the cache (a
    project's recipe file, which the next ``blocks`` command there imports). ``blocks eval`` of a
    run dir from elsewhere reads such data; the manifest is now refused when it is read."""
    fs, url, _ = s3
    manifest = json.loads(fs.cat(f"{url.removeprefix('s3://')}/{MANIFEST}"))
    escape = "./../../outside.py"
    manifest["splits"]["val"] = {"tokens": 64, "shards": [{"file": escape, "tokens": 64}]}
    fs.pipe(f"stream/evil/{MANIFEST}", json.dumps(manifest).encode())
    fs.pipe(f"stream/evil/{escape}", b"raise SystemExit('a file the storage chose')\n")
    cache = tmp_path / "deep" / "cache"
    evil = Stream(path="s3://stream/evil", seq_len=4, prefetch=0, cache_dir=str(cache))
    read_manifest.cache_clear()
    with pytest.raises(BlocksError) as refused:
        evil.build("val")[0]
    assert refused.value.problems[0].key == "data.path"
    assert "not a plain file name" in refused.value.problems[0].message
    assert not (tmp_path / "deep" / "outside.py").exists()
    plan = jobs.plan(
        ["recipe=tiny_lm", "data=stream", "data.path=s3://stream/evil", f"data.cache_dir={cache}"]
    )
    assert "shard-manifest" in {p.check for p in plan.errors}, [p.render() for p in plan.problems]


def metric_rows(run_dir: Path) -> list[tuple[str, ...]]:
    """The step and loss columns of ``metrics.csv`` (timings differ between runs)."""
    rows = list(csv.DictReader(io.StringIO((run_dir / "metrics.csv").read_text())))
    return [(r["step"], r.get("train/loss", ""), r.get("val/loss", "")) for r in rows]


@pytest.mark.slow
def test_ddp_from_s3_killed_and_rerun_matches_the_uninterrupted_run(s3) -> None:
    _, url, work = s3
    args = [
        "recipe=tiny_lm",
        "data=stream",
        f"data.path={url}",
        f"data.cache_dir={work / 'cache'}",
        "data.cache_limit_gb=0.0001",
        "data.shuffle_shards=2",
        "data.batch_size=8",
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.max_steps=14",
        "trainer.val_every=7",
        "monitor.log_every_n_steps=1",
        "checkpoint.every_n_steps=3",
        "model.dropout=0.1",
    ]
    whole = work / "uninterrupted"
    done = run_in_process(["run", *args, f"hydra.run.dir={whole}"], cwd=work)
    assert done.returncode == 0, done.output[-3000:]
    killed = work / "killed"
    with blocks_run_until_step([*args, f"hydra.run.dir={killed}"], cwd=work, step=8) as proc:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not (killed / "summary.json").exists() or read_summary(killed)["status"] != "completed"
    rerun = run_in_process(["run", *args, f"hydra.run.dir={killed}"], cwd=work)
    assert rerun.returncode == 0, rerun.output[-3000:]
    summary = read_summary(killed)
    assert summary["resumed_from"]
    assert summary["state_digest"] == read_summary(whole)["state_digest"]
    assert metric_rows(killed) == metric_rows(whole)


# --- shards prepared again, changed sources and options, manifests that cannot be read -----------


def read_all(block: Stream) -> object:
    """Every training sample's inputs, in id order, read afresh from the manifest."""
    read_manifest.cache_clear()
    dataset = block.build("train")
    return dataset.gather(list(range(len(dataset))))["inputs"]


def swapped_corpus(corpus: Path, root: Path) -> Path:
    """*corpus* with the case of every letter swapped: other samples in the same shard names and token counts."""
    root.mkdir(parents=True)
    for path in corpus.iterdir():
        (root / path.name).write_text(path.read_text().swapcase())
    return root


def test_shards_prepared_again_at_the_same_url_are_fetched_anew(s3, tmp_path: Path) -> None:
    """The cache kept files by URL and name alone: a run after a prepare of other sources at the
    same URL trained on the old shards' samples (its plan showed the new manifest)."""
    options = PrepareOptions(val_fraction=0, shard_tokens=25, workers=1)
    corpus = write_corpus(tmp_path / "a", files=2)
    url, cache = "s3://stream/again", tmp_path / "cache"
    block = Stream(path=url, seq_len=SEQ_LEN, prefetch=0, cache_dir=str(cache))
    prepare(str(corpus), url, options, progress=False)
    first = read_all(block)
    other = swapped_corpus(corpus, tmp_path / "b")
    prepare(str(other), url, options, progress=False)
    prepare(str(other), str(tmp_path / "local"), options, progress=False)
    truth = read_all(Stream(path=str(tmp_path / "local"), seq_len=SEQ_LEN))
    assert not truth.equal(first)
    assert read_all(block).equal(truth)
    # A cached copy cut short (a full disk, a copy by hand) is fetched again.
    for path in cache.rglob("*.bin"):
        os.truncate(path, 10)
    assert read_all(block).equal(truth)


def test_the_cache_limit_holds_for_the_whole_cache_directory(s3, tmp_path: Path) -> None:
    """``cache_limit_gb`` was kept per shard directory URL: two data sets filled twice the limit."""
    options = PrepareOptions(val_fraction=0, shard_tokens=25, workers=1)
    corpus, cache = write_corpus(tmp_path / "corpus", files=2), tmp_path / "cache"
    limit = 200  # bytes: a shard holds at most 50, each data set 260
    foreign = (
        cache / "0123456789abcdef" / "notes.txt"
    )  # another tool's file in a folder named like the cache's
    foreign.parent.mkdir(parents=True)
    foreign.write_text("not a shard")
    for url in ("s3://stream/limit-1", "s3://stream/limit-2"):
        prepare(str(corpus), url, options, progress=False)
        read_all(
            Stream(
                path=url,
                seq_len=SEQ_LEN,
                prefetch=0,
                shuffle_shards=1,
                cache_dir=str(cache),
                cache_limit_gb=limit / 1e9,
            )
        )
    assert 0 < sum(p.stat().st_size for p in cache.rglob("*.bin")) <= limit
    assert foreign.read_text() == "not a shard", "eviction removes the cache's own copies only"


def test_an_unreadable_manifest_says_check_the_url_and_credentials(
    s3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every failure to read the manifest said "prepare the shards first", missing credentials too."""
    import fsspec

    _, url, _ = s3
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)
    for key in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(key, "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setitem(fsspec.config.conf, "s3", {**fsspec.config.conf["s3"], "skip_instance_cache": True})
    read_manifest.cache_clear()
    with pytest.raises(BlocksError) as refused:
        read_manifest(url)
    problem = refused.value.problems[0]
    assert problem.key == "data.path" and "credentials" in problem.message + problem.fix
    assert "prepare the shards first" not in problem.fix
    read_manifest.cache_clear()


def test_a_prepare_that_fails_part_way_leaves_its_manifests_shards_whole(tmp_path: Path) -> None:
    """Shards were rewritten in place under fixed names, the manifest last: a prepare that stopped
    between the two left the old manifest over new shard files (other samples, other sizes)."""
    corpus, out = tmp_path / "corpus", tmp_path / "shards"
    corpus.mkdir()
    (corpus / "a.txt").write_text("".join(random.Random(1).choices(string.ascii_letters, k=300)))
    (corpus / "b.jsonl").write_text(json.dumps({"text": "a document " * 20}) + "\n")
    options = PrepareOptions(val_fraction=0, shard_tokens=1000, workers=1)
    prepare(str(corpus), str(out), options, progress=False)
    block = Stream(path=str(out), seq_len=8)
    before = read_all(block)
    (corpus / "a.txt").write_text("Z" * 100)  # a.txt is prepared again, then b.jsonl fails
    (corpus / "b.jsonl").write_text("not json\n")
    with pytest.raises(ValueError):
        prepare(str(corpus), str(out), options, progress=False)
    assert read_all(block).equal(before)
    block.preflight()
    (corpus / "b.jsonl").write_text(json.dumps({"text": "a document " * 20}) + "\n")
    again = prepare(str(corpus), str(out), options, progress=False)
    assert bytes(read_all(block)[0].tolist()) == b"Z" * 8
    named = {s.file for s in again.shards("train")}
    assert {p.name for p in out.glob("*.bin")} == named, "the shards the manifest no longer names are removed"


def test_prepare_again_follows_changed_options_and_tokenizer_file(tmp_path: Path) -> None:
    """A rerun kept the old shards when --val-fraction, --shard-tokens or the tokenizer file changed."""
    from blocks.data.shards.prepare import source_files, train_bpe

    corpus, out = write_corpus(tmp_path / "corpus", files=2, chars=400), str(tmp_path / "out")
    first = prepare(str(corpus), out, PrepareOptions(val_fraction=0.1, shard_tokens=1000, workers=1))
    halves = prepare(str(corpus), out, PrepareOptions(val_fraction=0.5, shard_tokens=1000, workers=1))
    assert halves.tokens("val") > first.tokens("val")
    smaller = prepare(str(corpus), out, PrepareOptions(val_fraction=0.5, shard_tokens=50, workers=1))
    assert len(smaller.shards("train")) > len(halves.shards("train"))
    tokenizer, files = tmp_path / "my_tok.json", source_files(str(corpus))
    tokenizer.write_text(train_bpe(files, 300, "text"))
    options = PrepareOptions(tokenizer=str(tokenizer), workers=1)
    with_file = prepare(str(corpus), out, options)
    tokenizer.write_text(train_bpe(files, 400, "text"))
    edited = prepare(str(corpus), out, options)
    assert (Path(out) / "tokenizer.json").read_text() == tokenizer.read_text()
    assert edited.vocab_size != with_file.vocab_size and edited.tokens() != with_file.tokens()


def test_data_source_prepares_the_files_added_since(tmp_path: Path) -> None:
    """``data.source`` reused the shards prepared first, whatever was added to the source since; then
    a plan that prepared again removed the shards a running job still read."""
    corpus = write_corpus(tmp_path / "corpus", files=2)
    block = Stream(source=str(corpus), seq_len=SEQ_LEN, cache_dir=str(tmp_path / "cache"))
    block.prepare()
    samples = block.num_samples("train")
    (corpus / "more.txt").write_text("more text " * 30)
    block.prepare()
    assert block.num_samples("train") > samples
    # A job still reading the shards of the manifest before (a plan in another terminal prepared
    # again) keeps them, through a plan with nothing new too; the change after that retires them.
    (out,) = (tmp_path / "cache" / "prepared").iterdir()

    def shards() -> set[str]:
        return {p.name for p in out.glob("*.bin")}

    first = shards()
    (corpus / "doc0.txt").write_text("changed " * 10)
    block.prepare()
    second = {
        s["file"]
        for split in json.loads((out / MANIFEST).read_text())["splits"].values()
        for s in split["shards"]
    }
    replaced = first - second
    assert replaced and shards() == first | second, "the previous manifest's shards stay"
    block.prepare()
    assert shards() == first | second
    (corpus / "doc0.txt").write_text("changed again " * 10)
    block.prepare()
    assert not replaced & shards() and second <= shards()


def as_prepared_before_shards_were_named_by_content(out: Path) -> None:
    """Rewrite a prepared directory *out* as blocks prepared it before: shard names without their
    content hash, records without options and largest id, shards without their sha256."""

    def old(shard: dict) -> dict:
        name = re.sub(r"-[0-9a-f]{16}(?=\.bin$)", "", shard["file"])
        if name != shard["file"]:
            (out / shard["file"]).rename(out / name)
        return {"file": name, "tokens": shard["tokens"]}

    for part in sorted((out / "parts").glob("*.json")):
        record = json.loads(part.read_text())
        record.pop("options"), record.pop("max_id")
        record["splits"] = {k: [old(s) for s in v] for k, v in record["splits"].items()}
        part.write_text(json.dumps(record))
    raw = json.loads((out / MANIFEST).read_text())
    raw.pop("max_id", None)
    for split in raw["splits"].values():
        split["shards"] = [
            {"file": s["file"].rsplit("-", 1)[0] + ".bin", "tokens": s["tokens"]} for s in split["shards"]
        ]
    (out / MANIFEST).write_text(json.dumps(raw))


def test_data_source_shards_prepared_by_an_earlier_release_are_kept_and_read_as_the_same_data(
    tmp_path: Path,
) -> None:
    """Regression: shards data.source prepared before records held their options were prepared again
    on the next plan, under new names (the old ones deleted), and a checkpoint trained on them was
    refused as trained on other data (the content digest hashed the new names)."""
    corpus = write_corpus(tmp_path / "corpus", files=2)
    block = Stream(source=str(corpus), seq_len=SEQ_LEN, cache_dir=str(tmp_path / "cache"))
    block.prepare()
    digest = block.content_digest()
    (out,) = (tmp_path / "cache" / "prepared").iterdir()
    as_prepared_before_shards_were_named_by_content(out)
    read_manifest.cache_clear()
    assert block.content_digest() == digest, "the same tokens under the names they had"
    files = sorted(p.name for p in out.glob("*.bin"))
    assert files and all(re.fullmatch(r"(train|val)-\d{5}-\d{3}\.bin", name) for name in files), files
    block.prepare()
    read_manifest.cache_clear()
    assert sorted(p.name for p in out.glob("*.bin")) == files, "nothing prepared again, nothing removed"
    assert block.content_digest() == digest


def test_a_manifest_the_reader_cannot_use_is_refused_naming_the_field(
    byte_shards: Path, tmp_path: Path
) -> None:
    """dtype uint8 trained on garbage; float32, negative or textual token counts, a vocabulary
    below the ids or shard files of another size failed with a traceback mid-training."""
    raw = json.loads((byte_shards / MANIFEST).read_text())

    def edited(name: str, edit) -> Stream:
        changed = json.loads(json.dumps(raw))
        edit(changed)
        (tmp_path / name).mkdir()
        (tmp_path / name / MANIFEST).write_text(json.dumps(changed))
        return Stream(path=str(tmp_path / name), seq_len=SEQ_LEN)

    first = lambda m: m["splits"]["train"]["shards"][0]  # noqa: E731
    cases = {
        "dtype": lambda m: m.update(dtype="uint8"),
        "float": lambda m: m.update(dtype="float32"),
        "tokens": lambda m: first(m).update(tokens=-500),
        "text": lambda m: first(m).update(tokens="many"),
        "vocab_size": lambda m: m.update(vocab_size=60),
        "tokenizer": lambda m: m.pop("tokenizer"),
    }
    for name, edit in cases.items():
        read_manifest.cache_clear()
        with pytest.raises(BlocksError) as refused:
            edited(name, edit).manifest()
        problem = refused.value.problems[0]
        assert problem.key == "data.path" and "field '" in problem.message, (name, problem.render())
        assert name.replace("float", "dtype").replace("text", "tokens") in problem.message
    # Shard files of another size than the manifest says: refused before any process starts.
    sized = tmp_path / "sized"
    shutil.copytree(byte_shards, sized)
    (sized / first(raw)["file"]).write_bytes(b"")
    block = Stream(path=str(sized), seq_len=SEQ_LEN)
    read_manifest.cache_clear()
    with pytest.raises(BlocksError, match="differ in size"):
        block.preflight()
    with pytest.raises(BlocksError, match="holds 0 bytes"):
        read_all(block)
