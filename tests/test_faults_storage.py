"""Checkpoint storage that cannot take the checkpoints is found before training, and a full disk says so."""

from __future__ import annotations

import contextlib
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from blocks.checkpoint.storage import out_of_space, preflight_storage
from blocks.launch import driver
from blocks.spec.errors import BlocksError
from tests.conftest import read_summary, run_in_process
from tests.test_checkpoint import s3_server  # noqa: F401  (a fixture)

pytestmark = pytest.mark.timeout(600)

BLOBS = ["recipe=blobs", "monitor.progress=off", "trainer.max_steps=6"]


@contextlib.contextmanager
def tmpfs(directory: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A small tmpfs at *directory* (root only; the test is skipped where mounting is not permitted)."""
    directory.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def assert_refused_before_training(run_dir: Path, overrides: list[str]) -> BlocksError:
    with pytest.raises(BlocksError) as refused:
        driver.run([*BLOBS, *overrides], run_dir)
    assert refused.value.problems[0].key == "checkpoint.dir"
    assert not (run_dir / "metrics.csv").exists(), "nothing was trained"
    return refused.value


def test_a_checkpoint_dir_under_a_file_is_refused_before_training(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    assert_refused_before_training(tmp_path / "run", [f"checkpoint.dir={tmp_path / 'a-file' / 'ckpt'}"])


def test_a_read_only_checkpoint_dir_is_refused_before_training(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as read_only:
        error = assert_refused_before_training(tmp_path / "run", [f"checkpoint.dir={read_only}/ckpt"])
    assert "Read-only file system" in error.problems[0].message


def test_a_missing_bucket_is_refused_before_training(tmp_path: Path, s3_server) -> None:  # noqa: F811
    error = assert_refused_before_training(tmp_path / "run", ["checkpoint.dir=s3://no-such-bucket/run"])
    assert "s3://no-such-bucket/run" in error.problems[0].message
    _, fs = s3_server
    assert not fs.exists("no-such-bucket"), "the probe must not create the bucket"


def test_a_full_disk_says_no_space_left_on_device_and_fails_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with tmpfs(tmp_path / "small", "400k") as small:
        args = [
            *BLOBS,
            "trainer.max_steps=12",
            f"checkpoint.dir={small}/ckpt",
            "checkpoint.every_n_steps=1",
            "checkpoint.keep_last=100",
            f"hydra.run.dir={run_dir}",
        ]
        result = run_in_process(["run", *args], cwd=tmp_path)
    # Steps were trained and checkpoints committed: the run failed (1), it did not fail to start (2).
    assert result.returncode == 1, result.output[-3000:]
    assert "training failed" in result.output and "could not start" not in result.output
    assert "checkpoint.dir: no space left on device" in result.output
    assert "enforce fail" not in result.output
    summary = read_summary(run_dir)
    assert summary["status"] == "failed" and summary["global_step"] > 0
    assert "no space left on device" in summary["reason"]


def test_out_of_space_is_found_through_torchs_runtime_error() -> None:
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
            ) from None
    except RuntimeError as exc:
        assert out_of_space(exc), "torch raises from the OSError's context"


def test_memory_checkpoints_are_refused_for_several_processes(tmp_path: Path) -> None:
    with pytest.raises(BlocksError) as refused:
        driver.prepare(
            [*BLOBS, "strategy=ddp", "trainer.devices=2", "checkpoint.dir=memory://ckpt"], tmp_path
        )
    assert refused.value.problems[0].key == "checkpoint.dir"
    assert "memory" in refused.value.problems[0].message


def test_memory_checkpoints_warn_for_one_process(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        preflight_storage("memory://blocks-preflight", world_size=1)
    assert "lost when the job ends" in caplog.text


def test_a_sharded_checkpoint_verifies_beside_an_object_stores_folder_marker(s3_server) -> None:  # noqa: F811
    """Consoles and sync tools create ``dcp/`` as an empty object; it is not a shard the manifest lacks."""
    import torch
    import torch.distributed.checkpoint as dcp

    from blocks.checkpoint import store
    from blocks.checkpoint.io import write_state
    from blocks.checkpoint.safe_dcp import check_sharded
    from blocks.compat.dcp_private import FsspecWriter

    _, fs = s3_server
    url = "s3://blocks-test/sharded"
    store.begin(url)
    dcp.save(
        {"model": {"w": torch.ones(4, 4)}}, storage_writer=FsspecWriter(store.join(url, "dcp")), no_dist=True
    )
    write_state(url, {"step": 1})
    manifest = store.Manifest(step=1, epoch=0, world_size=1, sharded=True, global_batch=1, block_digests={})
    store.commit(url, manifest)
    fs.pipe_file("blocks-test/sharded/dcp/", b"")
    fs.invalidate_cache()
    check_sharded(url, store.verify(url))
    fs.pipe_file("blocks-test/sharded/dcp/extra.distcp", b"not listed")
    fs.invalidate_cache()
    with pytest.raises(store.CheckpointError, match=r"dcp/extra\.distcp not in the manifest"):
        store.verify(url)
