"""A resume from an object store downloads ``state.pt`` once per process, with every check intact.

Against moto's S3 server (a real S3 protocol server on loopback): the bytes counted are those
the server sent for each object (s3fs's ``get_object`` calls, whatever reads them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
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
