"""A resume from an object store downloads ``state.pt`` once per process, with every check intact.

Against moto's S3 server (a real S3 protocol server on loopback): the bytes counted are those
the server sent for each object (s3fs's ``get_object`` calls, whatever reads them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blocks.checkpoint import store
from blocks.launch import driver
from tests.conftest import moto_s3_server

BLOBS = [
    "recipe=blobs",
    "monitor.progress=off",
    "trainer.max_epochs=null",
    "trainer.val_every=null",
    "checkpoint.every_n_steps=4",
]
BUCKET = "resume-reads"


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """moto's S3 server for this module, with this process's fsspec pointed at it; yields an s3fs of its own."""
    import fsspec

    with pytest.MonkeyPatch.context() as patch, moto_s3_server() as env:
        for key, value in env.items():
            patch.setenv(key, value)
        # Blocks of 5 MiB, the least s3fs writes (it reads 50 MiB ahead by default): a test state
        # of 16 MiB spans several, as a real one spans many of 50 MiB, so reads that jump show.
        conf = {"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"], "default_block_size": 5 << 20}
        patch.setitem(fsspec.config.conf, "s3", conf)
        import s3fs

        fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"])
        fs.mkdir(BUCKET)
        yield fs


@pytest.fixture(scope="module")
def trained(s3: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The checkpoint dir on S3 of an 8-step run (checkpoints at steps 4 and 8)."""
    directory = f"s3://{BUCKET}/run"
    run_dir = tmp_path_factory.mktemp("s3resume") / "first"
    summary = driver.run([*BLOBS, "trainer.max_steps=8", f"checkpoint.dir={directory}"], run_dir)
    assert summary.status == "completed"
    return directory


def copy_of(s3: Any, trained: str, name: str) -> str:
    """A copy of the trained run's checkpoints (steps 4 and 8) at ``s3://BUCKET/<name>``, for one test to resume or damage."""
    for step in (4, 8):
        step_dir = store.step_dir_name(step)
        s3.copy(f"{BUCKET}/run/{step_dir}", f"{BUCKET}/{name}/{step_dir}", recursive=True)
    return f"s3://{BUCKET}/{name}"


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Bytes the S3 server sent, per object key, from here on (every ``get_object``: ranged reads and whole ones)."""
    import s3fs

    sent: Counter[str] = Counter()
    call = s3fs.S3FileSystem._call_s3

    async def counted(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        response = await call(self, method, *args, **kwargs)
        if method == "get_object":
            sent[f"{kwargs['Bucket']}/{kwargs['Key']}"] += int(response.get("ContentLength") or 0)
        return response

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    return sent


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a fresh process: nothing verified, nothing kept."""
    monkeypatch.setattr(store, "_VERIFIED", {})
    monkeypatch.setattr(store, "_KEPT", {}, raising=False)  # raising: older versions kept nothing


def test_an_in_process_resume_from_s3_downloads_the_state_once(
    trained: str, s3: Any, fetched: Counter[str], tmp_path: Path
) -> None:
    """The driver's checks, the worker's checks and Lightning's load share one download of ``state.pt``.

    Before, the state was downloaded four times: hashed by the driver's verify, loaded by the
    driver's and again by the worker's safety check, and loaded by Lightning.
    """
    directory = copy_of(s3, trained, "in-process")
    resumed = f"{directory}/{store.step_dir_name(8)}"
    key = f"{BUCKET}/in-process/{store.step_dir_name(8)}/{store.STATE_FILE}"
    size = s3.size(key)
    fetched.clear()
    summary = driver.run([*BLOBS, "trainer.max_steps=10", f"checkpoint.dir={directory}"], tmp_path / "second")
    assert summary.status == "completed" and summary.resumed_from == resumed
    assert fetched[key] == size, f"{fetched[key] / size:.2f} downloads of {key} ({size} bytes)"
    assert not getattr(store, "_KEPT", {}), "the state is not held once it is loaded"


def test_a_driver_that_launches_workers_and_each_worker_download_the_state_once(
    trained: str, s3: Any, fetched: Counter[str], tmp_path: Path
) -> None:
    """Under torchrun the driver and each worker are processes of their own: each downloads ``state.pt`` once.

    ``driver.prepare`` is the driver's part (its checks, the job files), which keeps nothing
    after it; ``worker.train`` in a fresh process's state is a worker's (its checks and the load).
    """
    from blocks.launch.worker import train

    directory = copy_of(s3, trained, "launched")
    key = f"{BUCKET}/launched/{store.step_dir_name(8)}/{store.STATE_FILE}"
    size = s3.size(key)
    run_dir = tmp_path / "launched"
    fetched.clear()
    driver.prepare([*BLOBS, "trainer.max_steps=10", f"checkpoint.dir={directory}"], run_dir)
    assert fetched[key] == size, f"the driver downloaded it {fetched[key] / size:.2f} times"
    assert not store._KEPT, "a driver that trains nothing itself holds no state"
    store._VERIFIED.clear()  # the worker: a process of its own
    fetched.clear()
    summary = train(run_dir)
    assert summary.status == "completed" and summary.resumed_from == f"{directory}/{store.step_dir_name(8)}"
    assert fetched[key] == size, f"the worker downloaded it {fetched[key] / size:.2f} times"
    assert not store._KEPT


def test_a_load_from_s3_downloads_the_state_once_and_refuses_it_damaged(
    s3: Any, fetched: Counter[str]
) -> None:
    """The checkpoint IO's load of a state not checked before (a rollback's) downloads it once, hashing it.

    Read from the store by ``torch.load`` through a hashing reader, it was fetched more than
    twice: the zip reader reads the end first, and the hash needs every byte in order.
    """
    import torch

    from blocks.checkpoint.io import FsspecCheckpointIO

    weights = {f"layer{i}": torch.full((1 << 20,), float(i)) for i in range(4)}  # 16 MiB
    url = checkpoint_on_s3(s3, "loaded", {"state_dict": weights, "global_step": 8})
    key = f"{BUCKET}/loaded/{store.STATE_FILE}"
    fetched.clear()  # the commit hashed it
    state = FsspecCheckpointIO().load_checkpoint(url)
    assert state["global_step"] == 8 and torch.equal(state["state_dict"]["layer3"], weights["layer3"])
    assert fetched[key] == s3.size(key), f"{fetched[key] / s3.size(key):.2f} downloads"
    data = bytearray(s3.cat_file(key))
    data[len(data) // 2] ^= 0xFF
    s3.pipe_file(key, bytes(data))
    with pytest.raises(store.CheckpointError, match="does not match the manifest"):
        FsspecCheckpointIO().load_checkpoint(url)


def checkpoint_on_s3(s3: Any, name: str, state: Any) -> str:
    """A checkpoint of *state* committed at ``s3://BUCKET/<name>`` as blocks commits one."""
    import torch

    url = f"s3://{BUCKET}/{name}"
    store.begin(url)
    with s3.open(f"{BUCKET}/{name}/{store.STATE_FILE}", "wb") as fh:
        torch.save(state, fh)
    store.commit(
        url, store.Manifest(step=3, epoch=0, world_size=1, sharded=False, global_batch=4, block_digests={})
    )
    return url


def test_a_kept_state_is_not_handed_out_for_a_file_changed_since_its_check(
    s3: Any, fetched: Counter[str]
) -> None:
    """A ``state.pt`` rewritten between the resume's check and its load (same size, same second) is refused."""
    import torch

    from blocks.checkpoint.io import FsspecCheckpointIO, load_state, load_state_file

    url = checkpoint_on_s3(s3, "changed", {"w": torch.arange(50_000, dtype=torch.float32)})
    fetched.clear()  # the commit hashed it
    with store.keeping(load_state_file):
        store.verify(url)
    assert torch.equal(load_state(url, mmap=True)["w"], torch.arange(50_000, dtype=torch.float32))
    assert fetched[f"{BUCKET}/changed/{store.STATE_FILE}"] == s3.size(f"{BUCKET}/changed/{store.STATE_FILE}")
    key = f"{BUCKET}/changed/{store.STATE_FILE}"
    data = bytearray(s3.cat_file(key))
    data[len(data) // 2] ^= 0xFF
    s3.pipe_file(key, bytes(data))
    with pytest.raises(store.CheckpointError, match="does not match the manifest"):
        FsspecCheckpointIO().load_checkpoint(url)
    assert not store._KEPT


class Payload:
    """Not tensors or plain data: ``weights_only`` loading refuses to rebuild it."""


def test_an_unsafe_state_on_s3_is_still_refused_by_the_resume_and_the_load(s3: Any) -> None:
    """Verifying within ``keeping`` keeps nothing of a state that is unsafe to load; its readers refuse it as ever."""
    from blocks.checkpoint import resume
    from blocks.checkpoint.io import FsspecCheckpointIO, UnsafeCheckpointError, load_state_file
    from blocks.spec.errors import BlocksError

    url = checkpoint_on_s3(s3, "unsafe", {"payload": Payload()})
    with store.keeping(load_state_file):
        manifest = store.verify(url)  # the file matches its manifest: it is what blocks would refuse to run
    assert not store._KEPT
    with pytest.raises(BlocksError) as refused:
        resume._check_loadable(url, manifest)
    assert refused.value.problems[0].check == "checkpoint-unsafe"
    with pytest.raises(UnsafeCheckpointError):
        FsspecCheckpointIO().load_checkpoint(url)


def test_a_corrupt_state_on_s3_is_skipped_unloaded_and_the_older_one_kept(
    trained: str, s3: Any, fetched: Counter[str]
) -> None:
    """The newest checkpoint damaged: the resume falls back to the older one, whose state is the one kept."""
    from blocks.checkpoint.io import load_state_file

    copy = copy_of(s3, trained, "corrupt").removeprefix("s3://")
    damaged = f"{copy}/{store.step_dir_name(8)}/{store.STATE_FILE}"
    data = bytearray(s3.cat_file(damaged))
    data[len(data) // 2] ^= 0xFF
    s3.pipe_file(damaged, bytes(data))
    fetched.clear()
    with store.keeping(load_state_file):
        found, skipped = store.find_valid(f"s3://{copy}")
    assert found is not None and found.manifest.step == 4 and len(skipped) == 1
    older = f"s3://{copy}/{store.step_dir_name(4)}"
    assert list(store._KEPT) == [("s3", f"{copy}/{store.step_dir_name(4)}/{store.STATE_FILE}")]
    assert store.kept_state(f"s3://{copy}/{store.step_dir_name(8)}") is None
    assert store.kept_state(older, take=True)["global_step"] == 4
    assert not store._KEPT


def test_a_same_size_rewrite_within_the_second_is_hashed_again(s3: Any) -> None:
    """An object's modification time counts whole seconds; its ETag shows the rewrite."""
    import torch

    url = checkpoint_on_s3(s3, "rewritten", {"w": torch.arange(1000, dtype=torch.float32)})
    store.verify(url)
    key = f"{BUCKET}/rewritten/{store.STATE_FILE}"
    data = bytearray(s3.cat_file(key))
    data[len(data) // 2] ^= 0xFF
    s3.pipe_file(key, bytes(data))
    with pytest.raises(store.CheckpointError, match="does not match the manifest"):
        store.verify(url)


def _mapping_of(address: int) -> str | None:
    """The file mapped at *address* in this process (Linux's ``/proc/self/maps``; None: anonymous memory)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, _, _, _, _, *path = line.split(maxsplit=5)
        begin, end = (int(bound, 16) for bound in span.split("-"))
        if begin <= address < end:
            return path[0] if path and path[0].startswith("/") else None
    raise AssertionError(f"{address:#x} is not mapped")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_a_kept_state_is_read_from_a_local_copy_not_held_in_memory(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the download was held in memory while the state loaded from it (twice the file per
    process, per rank under DDP), and the kept state stayed in memory until the load took it. Now the
    download goes chunk by chunk to a nameless copy in the temporary directory, which the kept
    state's tensors map; with no room there (a directory that cannot be used),
    the bytes are held in memory as before."""
    import tempfile

    import torch

    from blocks.checkpoint.io import load_state, load_state_file

    weights = torch.randn(1 << 20)
    url = checkpoint_on_s3(s3, "large", {"w": weights})
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    for room in (True, False):
        monkeypatch.setattr(tempfile, "tempdir", str(temporary if room else tmp_path / "missing"))
        store._VERIFIED.clear()
        with store.keeping(load_state_file):
            store.verify(url)
        mapped = _mapping_of(store.kept_state(url)["w"].data_ptr())
        if room:
            assert mapped is not None and mapped.startswith(f"{temporary}/"), mapped
            assert mapped.endswith("(deleted)") and not list(temporary.iterdir()), "the copy has no name"
        else:
            assert mapped is None, mapped
        assert torch.equal(load_state(url)["w"], weights)


FULL_DISK = """
import logging, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
logging.basicConfig()
from blocks.checkpoint import store
from blocks.checkpoint.io import load_state, load_state_file
with store.keeping(load_state_file):
    store.verify(sys.argv[1])
print(float(load_state(sys.argv[1])["w"].sum()))
"""


def test_a_copy_the_disk_has_no_room_for_after_all_is_read_into_memory(s3: Any) -> None:
    """The room for the copy is judged before writing it, and the ranks of a job each write one: a
    write that failed for want of space (here a file-size limit, as a full disk fails it) ended the
    resume with a traceback instead of reading the file into memory."""
    import subprocess
    import sys

    import torch

    weights = torch.randn(1 << 20)  # 4 MiB, past the limit of 1 MiB
    url = checkpoint_on_s3(s3, "no-room", {"w": weights})
    done = subprocess.run([sys.executable, "-c", FULL_DISK, url], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no room left for a copy of state.pt" in done.stderr
    assert float(done.stdout.split()[-1]) == pytest.approx(float(weights.sum()), rel=1e-6)
