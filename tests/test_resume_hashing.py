"""A resume reads each checkpoint file for its hash at most once per process; summary.json's two throughputs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from blocks.checkpoint import store
from blocks.launch import driver

BLOBS = [
    "recipe=blobs",
    "monitor.progress=off",
    "monitor.log_every_n_steps=2",
    "trainer.max_epochs=null",
    "checkpoint.every_n_steps=4",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    run_dir = tmp_path_factory.mktemp("hashing") / "run"
    summary = driver.run([*BLOBS, "trainer.max_steps=8"], run_dir)
    assert summary.status == "completed"
    return run_dir, summary


def test_a_resume_hashes_each_checkpoint_file_once(
    trained: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, _ = trained
    hashed: Counter[str] = Counter()
    digest = store.file_digest

    def counted(fs: Any, path: str, algorithm: str = store.HASH) -> tuple[int, str]:
        hashed[path] += 1
        return digest(fs, path, algorithm)

    monkeypatch.setattr(store, "file_digest", counted)
    monkeypatch.setattr(store, "_VERIFIED", {})  # a fresh process: nothing verified yet
    summary = driver.run([*BLOBS, "trainer.max_steps=10"], run_dir)
    assert summary.resumed_from and summary.resumed_from.endswith(store.step_dir_name(8))
    assert hashed, "the resumed checkpoint was verified"
    assert max(hashed.values()) == 1, hashed


def test_a_file_changed_after_its_check_is_hashed_again(
    trained: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import shutil

    copy = tmp_path / "step"
    shutil.copytree(run_dir_step(trained[0]), copy)
    monkeypatch.setattr(store, "_VERIFIED", {})
    store.verify(str(copy))
    state = copy / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    stat = state.stat()
    os.utime(
        state, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000)
    )  # coarse clocks: make the change visible
    with pytest.raises(store.CheckpointError, match="does not match the manifest"):
        store.verify(str(copy))


def run_dir_step(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / store.step_dir_name(8)


def test_summary_reports_the_whole_run_and_the_steady_state_throughput(trained: tuple[Path, Any]) -> None:
    _, summary = trained
    assert summary.samples_per_s > 0
    assert summary.steady_samples_per_s is not None and summary.steady_samples_per_s > 0
    assert summary.steady_tokens_per_s is None  # blobs are not token data


@pytest.mark.parametrize("algorithm", sorted(store.DIGEST_HEX_LENGTHS))
def test_a_local_file_hashes_through_its_memory_map_as_any_reader_hashes_it(
    tmp_path: Path, algorithm: str
) -> None:
    """Local files are hashed from a memory map; the digest is the one every other file system gives."""
    import os

    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    memory = fsspec.filesystem("memory")
    for size in (0, 1, store._MAPPED_CHUNK, store._MAPPED_CHUNK + 3):
        data = os.urandom(size)
        (tmp_path / f"f{size}").write_bytes(data)
        memory.pipe_file(f"/hashing/f{size}", data)
        local = store.file_digest(LocalFileSystem(), str(tmp_path / f"f{size}"), algorithm)
        assert (
            local
            == store.file_digest(memory, f"/hashing/f{size}", algorithm)
            == (size, _digest(data, algorithm))
        )


def _digest(data: bytes, algorithm: str) -> str:
    hasher = store.new_hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


def test_a_local_file_that_cannot_be_mapped_is_read_instead(tmp_path: Path) -> None:
    """A pipe has no size to map: its bytes are read and hashed as any file system's."""
    import os
    import threading

    from fsspec.implementations.local import LocalFileSystem

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    data = os.urandom(3 * 2**20 + 5)
    writer = threading.Thread(target=pipe.write_bytes, args=(data,))
    writer.start()
    try:
        assert store.file_digest(LocalFileSystem(), str(pipe)) == (len(data), _digest(data, store.HASH))
    finally:
        writer.join()


def test_hashing_a_local_file_does_not_keep_it_resident(tmp_path: Path) -> None:
    """The peak resident memory of a process hashing a file stays far below the file's size.

    Pages of a memory map count as the process's resident memory, which Slurm and Ray's memory
    monitors act on: a whole checkpoint file mapped at once would look like a copy of it.
    """
    import subprocess
    import sys

    size = 24 * store._MAPPED_CHUNK
    path = tmp_path / "state.pt"
    with path.open("wb") as fh:
        for _ in range(24):
            fh.write(b"\x5a" * store._MAPPED_CHUNK)
    measure = (
        "import resource, sys\n"
        "from fsspec.implementations.local import LocalFileSystem\n"
        "from blocks.checkpoint import store\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "assert store.file_digest(LocalFileSystem(), sys.argv[1])[0] == int(sys.argv[2])\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n"
    )
    grown = int(subprocess.check_output([sys.executable, "-c", measure, str(path), str(size)], text=True))
    assert grown < size // 4, (
        f"hashing a {size >> 20} MiB file raised the peak resident memory by {grown >> 20} MiB"
    )
