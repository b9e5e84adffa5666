"""``checkpoint.async_save``: training waits only for the host copy; one save in flight; commit last."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem
from torch.optim.optimizer import register_optimizer_step_post_hook

from blocks.checkpoint import store
from blocks.launch import driver
from tests.conftest import FSDP_LM, run_in_process
from tests.test_checkpoint import LM, digest_of_uninterrupted, read_summary, run_and_kill_at

WRITE_DELAY_S = 0.3


class SlowFile(LocalFileOpener):
    """A local file opened for writing whose close takes ``WRITE_DELAY_S`` and is recorded."""

    def close(self) -> None:
        if not self.closed:
            time.sleep(WRITE_DELAY_S)
            SlowFileSystem.gate(self.path)
            SlowFileSystem.record("close", self.path)
        super().close()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SlowFileSystem(LocalFileSystem):
    """The local file system behind a slow link: closing a written file takes a while.

    Every open and close of a written file is recorded in ``events`` as ``(kind, path)``.
    """

    protocol = ("slowfile",)
    events: list[tuple[str, str]] = []
    lock = threading.Lock()

    gate: Callable[[str], None] = staticmethod(lambda path: None)
    """Called with the path of each written file as it closes, after the delay (see :func:`training_overtakes`)."""

    @classmethod
    def record(cls, kind: str, path: str) -> None:
        with cls.lock:
            cls.events.append((kind, path))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "w" not in mode:
            return super()._open(path, mode, **kwargs)
        path = self._strip_protocol(path)
        self.makedirs(self._parent(path), exist_ok=True)
        self.record("open", path)
        return SlowFile(path, mode, fs=self, **kwargs)


@pytest.fixture
def slow_fs():
    fsspec.register_implementation("slowfile", SlowFileSystem, clobber=True)
    SlowFileSystem.events = []
    yield SlowFileSystem.events


OVERTAKE_TIMEOUT_S = 60
"""How long a save's write waits for training to go on (a regression makes each non-final save wait this long)."""


@contextlib.contextmanager
def training_overtakes(max_steps: int) -> Iterator[dict[int, bool]]:
    """Hold each save's ``state.pt`` open until training took the optimizer step after the save's step.

    Yields ``{step: whether training took the next step while that save's state was still being
    written}`` for every save but the final one (at *max_steps*, which nothing trains after).
    A save that stalls training for its write never sees the next step (the write waits for
    training, training for the write) until :data:`OVERTAKE_TIMEOUT_S` has passed: False.
    Optimizer steps are counted by torch's global optimizer step hook, in this process.
    """
    steps = 0
    stepped = threading.Condition()
    overtaken: dict[int, bool] = {}

    def count(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal steps
        with stepped:
            steps += 1
            stepped.notify_all()

    def wait_for_the_next_step(path: str) -> None:
        step_dir, name = path.rsplit("/", 2)[-2:]
        if name != store.STATE_FILE or not step_dir.startswith("step-"):
            return  # a manifest, a file beside the state, the probe of the dir's writability
        step = int(step_dir.removeprefix("step-"))
        if step < max_steps:
            with stepped:
                overtaken[step] = stepped.wait_for(lambda: steps > step, timeout=OVERTAKE_TIMEOUT_S)

    handle = register_optimizer_step_post_hook(count)
    SlowFileSystem.gate = staticmethod(wait_for_the_next_step)
    try:
        yield overtaken
    finally:
        SlowFileSystem.gate = staticmethod(lambda path: None)
        handle.remove()


def saves(events: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(kind, step dir) of each state file opened and each manifest closed, in order.

    A local manifest is closed under a temporary name and renamed into place right after.
    """
    out = []
    for kind, path in events:
        step_dir = path.rsplit("/", 2)[-2]
        if (kind, path.rsplit("/", 1)[-1]) in (("open", "state.pt"), ("close", store.MANIFEST_WRITING)):
            out.append((kind, step_dir))
    return out


ARGS = [
    "recipe=tiny_lm",
    "trainer.max_steps=12",
    "trainer.val_every=null",
    "checkpoint.every_n_steps=3",
    "checkpoint.keep_last=2",
    "monitor.progress=off",
]


def test_async_save_stalls_only_for_the_host_copy_and_commits_every_save_in_order(
    tmp_path: Path, slow_fs: list[tuple[str, str]]
) -> None:
    sync = driver.run([*ARGS, f"checkpoint.dir=slowfile://{tmp_path / 'sync'}"], tmp_path / "a")
    sync_events = saves(slow_fs)
    slow_fs.clear()
    directory = f"slowfile://{tmp_path / 'async'}"
    with training_overtakes(max_steps=12) as overtaken:
        async_ = driver.run(
            [*ARGS, f"checkpoint.dir={directory}", "checkpoint.async_save=true"], tmp_path / "b"
        )

    assert async_.status == sync.status == "completed"
    assert async_.state_digest == sync.state_digest, "saving in the background must not change training"
    # A sync save stalls training for both slow writes (state and manifest).
    assert sync.checkpoint_stall_s >= 4 * 2 * WRITE_DELAY_S
    # An async one only for the host copy (and for the save still in flight, which training this
    # short catches up with): training took the next step while each save's state was being
    # written. Each write waits for that step, so a save that waited for its own write fails here
    # (comparing the two runs' stall totals was a race on a loaded machine: the async run waits
    # out most of each previous write, and its background writes compete with training).
    assert overtaken == {3: True, 6: True, 9: True}, overtaken
    # One save in flight: each save's manifest is committed before the next save starts writing.
    expected = []
    for step in (3, 6, 9, 12):
        expected += [("open", store.step_dir_name(step)), ("close", store.step_dir_name(step))]
    assert saves(slow_fs) == expected == sync_events
    committed, uncommitted = store.scan(directory)
    assert [c.manifest.step for c in committed] == [9, 12] and not uncommitted
    for checkpoint in committed:
        store.verify(checkpoint.url)


def test_kill_9_during_async_saves_and_rerun_reaches_the_uninterrupted_digest(tmp_path: Path) -> None:
    args = [*LM, "checkpoint.async_save=true"]
    expected_digest, _ = digest_of_uninterrupted(args, tmp_path)
    run_dir = tmp_path / "killed"
    run_and_kill_at([*args, f"hydra.run.dir={run_dir}"], tmp_path, step=14)
    result = run_in_process(["run", *args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    summary = read_summary(run_dir)
    assert summary["resumed_from"], "the rerun must resume from a committed checkpoint"
    assert summary["state_digest"] == expected_digest


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")  # with the FSDP save/resume test, which shares fsdp_sync_run
def test_fsdp_async_save_commits_shards_and_matches_sync(fsdp_sync_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "async"
    result = run_in_process(
        ["run", *FSDP_LM, "trainer.max_steps=8", "checkpoint.async_save=true", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.output[-3000:]
    for saved in (fsdp_sync_run, run_dir):
        committed, uncommitted = store.scan(str(saved / "checkpoints"))
        assert [c.manifest.step for c in committed] == [4, 8] and not uncommitted
        assert all(c.manifest.sharded for c in committed)
        store.verify(committed[-1].url)
    assert read_summary(run_dir)["state_digest"] == read_summary(fsdp_sync_run)["state_digest"]
    resumed = tmp_path / "resumed"
    result = run_in_process(
        [
            "run",
            *FSDP_LM,
            "checkpoint.async_save=true",
            "trainer.max_steps=10",
            f"checkpoint.resume={run_dir / 'checkpoints' / store.step_dir_name(8)}",
            f"hydra.run.dir={resumed}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.output[-3000:]
    assert read_summary(resumed)["global_step"] == 10


def test_an_async_save_with_nothing_in_flight_stalls_only_for_the_copy(
    tmp_path: Path, slow_fs: list[tuple[str, str]]
) -> None:
    directory = f"slowfile://{tmp_path / 'ckpt'}"
    only_final = [
        *ARGS,
        "checkpoint.every_n_steps=0",
        f"checkpoint.dir={directory}",
        "checkpoint.async_save=true",
    ]
    summary = driver.run(only_final, tmp_path / "run")
    assert summary.checkpoint_stall_s < WRITE_DELAY_S / 2
    # The run still waited for the commit before it ended.
    committed, _ = store.scan(directory)
    assert [c.manifest.step for c in committed] == [12]
    assert saves(slow_fs)[-1] == ("close", store.step_dir_name(12))
