"""Checkpoint manifests hashed in one pass with XXH3-128; BLAKE3 and sha256 manifests of earlier versions still verify.

Every test writes a tiny checkpoint with the real checkpoint IO plugin (or by hand, as an
earlier version of blocks did) into a temporary directory, in process.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

from blocks.checkpoint import store
from blocks.checkpoint.io import FsspecCheckpointIO, HostStager

STATE = {"state_dict": {"w": torch.arange(4096, dtype=torch.float32)}, "global_step": 3}


def save(directory: Path) -> Path:
    """A checkpoint committed by the checkpoint IO plugin, as training writes it."""
    io = FsspecCheckpointIO()
    io.pending_manifest = store.Manifest(
        step=3, epoch=0, world_size=1, sharded=False, global_batch=4, block_digests={}
    )
    io.save_checkpoint(STATE, str(directory))
    return directory


def flip_a_byte(path: Path) -> None:
    """Change one byte in the middle, same size, with a modification time that shows the change."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def manifest_json(directory: Path) -> dict[str, Any]:
    return json.loads((directory / store.MANIFEST).read_text())


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing verified yet, as in a new process."""
    monkeypatch.setattr(store, "_VERIFIED", {})


def test_a_save_records_the_xxh3_of_the_bytes_it_wrote(tmp_path: Path) -> None:
    checkpoint = save(tmp_path / "step")
    data = manifest_json(checkpoint)
    entry = data["files"][store.STATE_FILE]
    written = (checkpoint / store.STATE_FILE).read_bytes()
    assert data["format"] == store.FORMAT
    assert entry == {"size": len(written), "xxh3_128": xxhash.xxh3_128(written).hexdigest()}
    assert store.verify(str(checkpoint)).step == 3


def test_a_one_pass_manifest_still_catches_a_flipped_byte(tmp_path: Path) -> None:
    checkpoint = save(tmp_path / "step")
    flip_a_byte(checkpoint / store.STATE_FILE)
    with pytest.raises(store.CheckpointError, match="does not match the manifest"):
        store.verify(str(checkpoint))
    with pytest.raises(store.CheckpointError, match="does not match the manifest"):
        FsspecCheckpointIO().load_checkpoint(str(checkpoint))


def test_a_garbled_state_is_refused_as_corrupt_not_as_a_load_error(tmp_path: Path) -> None:
    """The load overlaps the hash: when the load itself fails on the damaged file, the mismatch is raised."""
    checkpoint = save(tmp_path / "step")
    state = checkpoint / store.STATE_FILE
    state.write_bytes(b"\0" * state.stat().st_size)
    with pytest.raises(store.CheckpointError, match="does not match the manifest"):
        FsspecCheckpointIO().load_checkpoint(str(checkpoint))


def test_a_verified_load_hands_over_the_state_once_it_matches(tmp_path: Path) -> None:
    checkpoint = save(tmp_path / "step")
    loaded = FsspecCheckpointIO().load_checkpoint(str(checkpoint))
    assert torch.equal(loaded["state_dict"]["w"], STATE["state_dict"]["w"])
    assert loaded["global_step"] == 3


def test_an_uncommitted_checkpoint_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    checkpoint = save(tmp_path / "step")
    (checkpoint / store.MANIFEST).unlink()
    calls: list[str] = []
    with pytest.raises(store.CheckpointError, match="not a committed checkpoint"):
        store.load_verified(str(checkpoint), lambda fh: calls.append("loaded"))
    assert calls == []


OLD_MANIFESTS = {
    "format-1": ("blocks-checkpoint/1", "sha256"),
    "no-format": (None, "sha256"),  # the earliest manifests had no format field
    "format-2-sha256": ("blocks-checkpoint/2", "sha256"),
    "format-2-blake3": ("blocks-checkpoint/2", "blake3"),
}


def old_manifest(
    checkpoint: Path, version: str | None = "blocks-checkpoint/1", algorithm: str = "sha256"
) -> None:
    """Rewrite the manifest as an earlier version of blocks wrote it: format *version*, *algorithm* entries."""
    data = manifest_json(checkpoint)
    written = (checkpoint / store.STATE_FILE).read_bytes()
    digest = store.new_hasher(algorithm)
    digest.update(written)
    data["files"] = {store.STATE_FILE: {"size": len(written), algorithm: digest.hexdigest()}}
    if version is None:
        del data["format"]
    else:
        data["format"] = version
    (checkpoint / store.MANIFEST).write_text(json.dumps(data))


@pytest.mark.parametrize("old", list(OLD_MANIFESTS))
def test_an_old_manifest_still_verifies_and_loads(tmp_path: Path, old: str) -> None:
    checkpoint = save(tmp_path / "step")
    old_manifest(checkpoint, *OLD_MANIFESTS[old])
    assert store.verify(str(checkpoint)).step == 3
    store._VERIFIED.clear()
    loaded = FsspecCheckpointIO().load_checkpoint(str(checkpoint))
    assert torch.equal(loaded["state_dict"]["w"], STATE["state_dict"]["w"])
    store._VERIFIED.clear()
    flip_a_byte(checkpoint / store.STATE_FILE)
    with pytest.raises(store.CheckpointError, match="does not match the manifest"):
        store.verify(str(checkpoint))


def test_recommitting_an_old_checkpoint_writes_xxh3(tmp_path: Path) -> None:
    checkpoint = save(tmp_path / "step")
    old_manifest(checkpoint, "blocks-checkpoint/2", "blake3")
    store.commit(str(checkpoint), store.read_manifest(str(checkpoint)))
    data = manifest_json(checkpoint)
    assert data["format"] == store.FORMAT and "xxh3_128" in data["files"][store.STATE_FILE]
    assert store.verify(str(checkpoint)).step == 3


DIGEST_DAMAGE = {
    "unknown-algorithm": lambda e, m: e.update(md5=e.pop("xxh3_128")),
    "two-digests": lambda e, m: e.update(sha256="0" * 64),
    "no-digest": lambda e, m: e.pop("xxh3_128"),
    "short-digest": lambda e, m: e.update(xxh3_128="abc"),
    "sha256-length-xxh3": lambda e, m: e.update(xxh3_128="0" * 64),
    "upper-case-digest": lambda e, m: e.update(xxh3_128=e["xxh3_128"].upper()),
    "xxh3-in-format-2": lambda e, m: m.update(format="blocks-checkpoint/2"),
    "xxh3-in-format-1": lambda e, m: m.update(format="blocks-checkpoint/1"),
    "unknown-format": lambda e, m: m.update(format="blocks-checkpoint/99"),
}


@pytest.mark.parametrize("damage", list(DIGEST_DAMAGE))
def test_a_manifest_with_a_bad_digest_entry_is_damaged(tmp_path: Path, damage: str) -> None:
    checkpoint = save(tmp_path / "step")
    data = manifest_json(checkpoint)
    DIGEST_DAMAGE[damage](data["files"][store.STATE_FILE], data)
    (checkpoint / store.MANIFEST).write_text(json.dumps(data))
    with pytest.raises(store.CheckpointError, match=r"damaged MANIFEST\.json"):
        store.read_manifest(str(checkpoint))


def test_staging_copies_on_one_thread_and_restores_the_thread_count() -> None:
    before = torch.get_num_threads()  # the suite runs on one thread: restoring 1 would show nothing
    torch.set_num_threads(2)
    try:
        tied = torch.ones(8)
        snapshot = HostStager().stage({"a": tied, "b": tied, "c": [torch.zeros(2)]})
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert snapshot["a"] is snapshot["b"] and snapshot["a"] is not tied
    assert torch.equal(snapshot["a"], tied) and torch.equal(snapshot["c"][0], torch.zeros(2))


def test_state_files_skip_the_zip_crc_and_still_load_with_torch(tmp_path: Path) -> None:
    """The manifest's digest replaces the zip CRC32 pass (a private torch path, pinned here)."""
    import io
    import zipfile

    checkpoint = save(tmp_path / "step")
    written = checkpoint / store.STATE_FILE
    loaded = torch.load(written, weights_only=True)
    assert torch.equal(loaded["state_dict"]["w"], STATE["state_dict"]["w"]) and loaded["global_step"] == 3
    assert zipfile.ZipFile(written).testzip() is not None  # records carry no CRC32
    plain = io.BytesIO()
    torch.save(STATE, plain)
    assert len(plain.getvalue()) == written.stat().st_size  # the same layout otherwise


WAIT_S = 10
"""How long one side waits for the other in the overlap tests before calling it sequential."""


def test_a_local_state_is_hashed_on_another_thread_while_it_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each side waits for the other to have started: sequential hashing and loading cannot pass."""
    checkpoint = save(tmp_path / "step")
    loading, hashed = threading.Event(), threading.Event()
    digest = store.file_digest

    def hash_while_loading(fs: Any, path: str, algorithm: str = store.HASH) -> tuple[int, str]:
        assert loading.wait(WAIT_S), "the hash started only after the load"
        result = digest(fs, path, algorithm)
        hashed.set()
        return result

    def load(fh: Any) -> Any:
        loading.set()
        assert hashed.wait(WAIT_S), "the load waited for no hash beside it"
        return torch.load(fh, weights_only=True)

    monkeypatch.setattr(store, "file_digest", hash_while_loading)
    loaded = store.load_verified(str(checkpoint), load)
    assert loaded["global_step"] == 3
    store._VERIFIED.clear()
    flip_a_byte(checkpoint / store.STATE_FILE)
    loading.clear(), hashed.clear()
    with pytest.raises(store.CheckpointError, match="does not match the manifest"):
        store.load_verified(str(checkpoint), load)


def test_the_files_of_a_checkpoint_are_hashed_several_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committing and verifying a checkpoint of several files (a sharded one) hashes them on parallel threads."""
    checkpoint = save(tmp_path / "step")
    for shard in range(3):
        (checkpoint / f"shard-{shard}.distcp").write_bytes(os.urandom(4096))
    together = threading.Barrier(2, timeout=WAIT_S)  # a second file's hash must start before the first ends
    digest = store.file_digest

    def hash_beside_another(fs: Any, path: str, algorithm: str = store.HASH) -> tuple[int, str]:
        together.wait()
        return digest(fs, path, algorithm)

    monkeypatch.setattr(store, "file_digest", hash_beside_another)
    manifest = store.commit(str(checkpoint), store.read_manifest(str(checkpoint)))
    assert len(manifest.files) == 4
    store._VERIFIED.clear()
    together.reset()
    assert store.verify(str(checkpoint)).files == manifest.files
    store._VERIFIED.clear()
    flip_a_byte(checkpoint / "shard-1.distcp")
    together.reset()
    with pytest.raises(store.CheckpointError, match=r"shard-1\.distcp does not match the manifest"):
        store.verify(str(checkpoint))


def test_block_digests_of_what_earlier_versions_saved_are_unchanged() -> None:
    """Regression: digesting an Enum by name changed the digest of a ``str``- or ``int``-based Enum field
    (JSON writes those by value), so a checkpoint saved before no longer resumed ("a different model").
    Every value an earlier version could digest keeps its digest; a plain Enum (which could not be saved
    before) is digested by name, as ``config.yaml`` writes it."""
    import enum
    import hashlib

    class Act(str, enum.Enum):
        RELU = "relu"

    class Width(enum.IntEnum):
        WIDE = 3

    class Shade(enum.Enum):
        DARK = 1

    model = {
        "_block_": "net",
        "act": Act.RELU,
        "width": Width.WIDE,
        "sizes": (4, 8),
        "path": Path("/data/x"),
        "dropout": 0.1,
        "init_from": None,
        "kwargs": {"b": [1, 2], "a": {"c": True}},
    }
    earlier = hashlib.sha256(json.dumps(model, sort_keys=True, default=str).encode()).hexdigest()
    assert store.block_digests({"model": model})["model"] == earlier
    assert store.canonical_json({"shade": Shade.DARK}) == '{"shade": "DARK"}'
