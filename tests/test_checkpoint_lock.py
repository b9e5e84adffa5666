"""One job at a time per checkpoint dir: concurrent jobs sharing ``checkpoint.dir`` do not clobber each other.

Each holder is a real ``blocks run``, stopped with SIGSTOP while a second job tries the same
checkpoint dir (a stopped process still holds its lock: its pid is alive), then let go on.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from subprocess import Popen

import pytest

from blocks.checkpoint import store
from blocks.checkpoint.resume import read_start
from blocks.launch import driver
from blocks.launch.lock import (
    CHECKPOINT_LOCK_FILE,
    LOCK_FILE,
    RUN_DIR_FIX,
    DirBusy,
    DirLock,
    checkpoint_dir_locked,
)
from blocks.launch.torchrun import multi_node_job
from tests.conftest import blocks_run_until_step, run_cli, spawned
from tests.test_checkpoint import s3_server  # noqa: F401  (a fixture)

pytestmark = pytest.mark.timeout(600)

LONG = [
    "recipe=blobs",
    "trainer.max_steps=100",
    "checkpoint.every_n_steps=5",
    "checkpoint.keep_last=3",
    "monitor.log_every_n_steps=1",
]
"""About 100 quick steps with a checkpoint every 5: still training when stopped at step 5.

blobs' own 4096 samples (115 steps an epoch): 200000 made each run generate, and validate at
its end, 50 times the data, about 5 s a run for nothing these tests check."""
TINY = ["recipe=blobs", "trainer.max_steps=5", "monitor.progress=off"]


@contextmanager
def stopped(proc: Popen) -> Iterator[None]:
    """*proc*'s process group stopped (SIGSTOP) for the duration of the block, then continued."""
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with suppress(ProcessLookupError):  # killed meanwhile
            os.killpg(proc.pid, signal.SIGCONT)


def files_under(directory: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(directory)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in directory.rglob("*")
        if p.is_file()
    }


def test_a_second_job_into_a_held_checkpoint_dir_is_refused_and_the_first_loses_nothing(
    tmp_path: Path,
) -> None:
    shared, first_dir, second_dir = tmp_path / "shared", tmp_path / "first", tmp_path / "second"
    first_args = [*LONG, f"hydra.run.dir={first_dir}", f"checkpoint.dir={shared}"]
    with blocks_run_until_step(first_args, cwd=tmp_path, step=5) as first:
        with stopped(first):
            before = files_under(shared)
            second = run_cli(
                ["run", *LONG, f"hydra.run.dir={second_dir}", f"checkpoint.dir={shared}"], cwd=tmp_path
            )
            after = files_under(shared)
        out, _ = first.communicate(timeout=240)
    assert second.returncode == 2, second.output[-3000:]
    assert "checkpoint.dir" in second.output and "Traceback" not in second.output
    assert f"pid {first.pid} on host {socket.gethostname()}" in second.output
    assert str(first_dir) in second.output, "the holder's run dir is named"
    assert "choose another checkpoint.dir" in second.output
    assert after == before, "the refused job wrote nothing into the checkpoint dir"
    assert not (second_dir / "config.yaml").exists() and not (second_dir / "checkpoints").exists()

    assert first.returncode == 0, out[-3000:]
    committed, uncommitted = store.scan(str(shared))
    assert [c.manifest.step for c in committed] == [90, 95, 100] and uncommitted == []
    job = read_start(first_dir).job
    for checkpoint in committed:
        assert checkpoint.manifest.job == job
        store.verify(checkpoint.url)
    assert not (shared / CHECKPOINT_LOCK_FILE).exists(), "the lock is given back at the end"

    # The normal resume case: a later job continues in the checkpoint dir the first one left.
    resumed = driver.run(
        [*LONG, "trainer.max_steps=103", "monitor.progress=off", f"checkpoint.dir={shared}"],
        tmp_path / "third",
    )
    assert resumed.status == "completed" and resumed.resumed_from == store.join(str(shared), "step-000000100")
    assert not (shared / CHECKPOINT_LOCK_FILE).exists()


def write_lock(directory: Path, **holder: object) -> None:
    """A checkpoint-dir lock in *directory* with the given holder fields."""
    directory.mkdir(parents=True, exist_ok=True)
    content = {"host": socket.gethostname(), "pid": os.getpid(), "started": "then", "heartbeat": time.time()}
    (directory / CHECKPOINT_LOCK_FILE).write_text(json.dumps({**content, **holder}))


def test_a_checkpoint_dir_whose_holder_died_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared"
    write_lock(shared, pid=2**22 + 12345, run_dir="/gone/run")  # no such process on this host
    with caplog.at_level(logging.WARNING):
        summary = driver.run([*TINY, f"checkpoint.dir={shared}"], tmp_path / "run")
    assert summary.status == "completed"
    assert f"stale lock {shared / CHECKPOINT_LOCK_FILE}" in caplog.text
    assert not (shared / CHECKPOINT_LOCK_FILE).exists()


def test_a_checkpoints_dir_is_one_jobs_whichever_starts_first_and_however_it_is_spelled(
    tmp_path: Path,
) -> None:
    """Every job locks its checkpoint dir, its run dir's default ``checkpoints/`` too: a job whose
    ``checkpoint.dir`` is another run's ``checkpoints/`` meets that run's lock, and the run meets
    the job's when the job came first (before, only the first order was refused, and a symlink
    to the dir was not refused at all)."""
    with spawned([sys.executable, "-c", "import time; time.sleep(600)"]) as holder:
        first = tmp_path / "first"
        write_lock(first / "checkpoints", pid=holder.pid, run_dir=str(first))  # as the first job holds it
        (tmp_path / "link").symlink_to(first / "checkpoints")
        for spelling in (first / "checkpoints", tmp_path / "link"):
            with pytest.raises(DirBusy) as refused:
                driver.run([*TINY, f"checkpoint.dir={spelling}"], tmp_path / "second")
            problem = refused.value.problems[0]
            assert problem.key == "checkpoint.dir" and f"pid {holder.pid}" in problem.message
        other = tmp_path / "other"
        write_lock(other / "checkpoints", pid=holder.pid, run_dir=str(tmp_path / "elsewhere"))
        with pytest.raises(DirBusy):  # the job that names other/checkpoints came first
            driver.run(TINY, other)
        third = tmp_path / "third"
        third.mkdir()
        (third / LOCK_FILE).write_text(
            json.dumps({"host": socket.gethostname(), "pid": holder.pid, "heartbeat": time.time()})
        )
        with pytest.raises(DirBusy):  # a live job's run dir is that job's
            driver.run([*TINY, f"checkpoint.dir={third}"], tmp_path / "fourth")
    assert not any((first / "checkpoints").glob("step-*")) and not any((other / "checkpoints").glob("step-*"))
    assert not (other / "config.yaml").exists()


def test_every_checkpoint_dir_is_locked_but_one_processs_memory(tmp_path: Path) -> None:
    plan = driver.prepare(TINY, tmp_path / "run")
    assert driver.locks_checkpoint_dir(tmp_path / "run", plan)
    elsewhere = driver.prepare([*TINY, f"checkpoint.dir={tmp_path / 'ckpt'}"], tmp_path / "other")
    assert driver.locks_checkpoint_dir(tmp_path / "other", elsewhere)
    memory = driver.prepare([*TINY, "checkpoint.dir=memory://ckpt"], tmp_path / "memory")
    assert not driver.locks_checkpoint_dir(tmp_path / "memory", memory)


def stored(fs, key: str) -> bool:
    """Whether the object *key* is there now (not what an earlier listing cached)."""
    fs.invalidate_cache()
    return fs.exists(key)


def test_an_s3_checkpoint_dir_held_by_a_live_job_is_refused_and_taken_over_once_it_died(
    tmp_path: Path,
    s3_server,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, fs = s3_server
    url = "s3://blocks-test/shared"
    holder_args = [*LONG, f"hydra.run.dir={tmp_path / 'first'}", f"checkpoint.dir={url}"]
    with blocks_run_until_step(holder_args, cwd=tmp_path, step=5) as holder, stopped(holder):
        before = sorted(fs.find("blocks-test/shared"))
        with pytest.raises(DirBusy) as refused:
            driver.run([*TINY, f"checkpoint.dir={url}"], tmp_path / "second")
        assert sorted(fs.find("blocks-test/shared")) == before, "the refused job wrote nothing"
        os.killpg(holder.pid, signal.SIGKILL)
    problem = refused.value.problems[0]
    assert problem.key == "checkpoint.dir"
    assert f"pid {holder.pid} on host {socket.gethostname()}" in problem.message
    assert str(tmp_path / "first") in problem.message
    assert not (tmp_path / "second" / "config.yaml").exists()

    # The killed holder left its lock object behind: its pid is dead on this host, so it is stale.
    assert stored(fs, f"blocks-test/shared/{CHECKPOINT_LOCK_FILE}")
    with caplog.at_level(logging.WARNING), checkpoint_dir_locked(url, tmp_path / "third"):
        assert f"pid {holder.pid}" in caplog.text and "stale lock" in caplog.text
    assert not stored(fs, f"blocks-test/shared/{CHECKPOINT_LOCK_FILE}")


def test_an_s3_lock_keeps_its_heartbeat_and_one_from_another_host_goes_stale_by_age_only(
    s3_server,  # noqa: F811
) -> None:
    _, fs = s3_server
    url, key = "s3://blocks-test/beat", f"blocks-test/beat/{CHECKPOINT_LOCK_FILE}"
    far = {"host": "elsewhere", "pid": 1, "started": "then", "run_dir": "/elsewhere/run"}
    fs.pipe_file(key, json.dumps({**far, "heartbeat": time.time()}).encode())
    with pytest.raises(DirBusy, match=r"pid 1 on host elsewhere.*run dir /elsewhere/run"):
        DirLock(
            url, "checkpoint.dir", "fix", file_name=CHECKPOINT_LOCK_FILE
        ).acquire()  # pid 1: not looked up

    fs.pipe_file(key, json.dumps({**far, "heartbeat": time.time() - 3600}).encode())
    lock = DirLock(url, "checkpoint.dir", "fix", heartbeat_s=0.2, file_name=CHECKPOINT_LOCK_FILE)
    lock.acquire()
    try:
        first = json.loads(fs.cat_file(key))
        assert first["pid"] == os.getpid()
        deadline = time.monotonic() + 30
        while json.loads(fs.cat_file(key))["heartbeat"] == first["heartbeat"]:
            assert time.monotonic() < deadline, "the heartbeat was never refreshed"
            time.sleep(0.1)
    finally:
        lock.release()
    assert not stored(fs, key)

    # The drivers of a multi-node job share it there too, until the last one ends.
    first, joined = (
        DirLock(url, "checkpoint.dir", "fix", file_name=CHECKPOINT_LOCK_FILE, job="j") for _ in "ab"
    )
    first.acquire()
    joined.acquire()
    assert joined.joined
    first.release()
    assert stored(fs, key)
    joined.release()
    assert not stored(fs, key)


def test_a_multi_node_jobs_lock_is_held_until_its_last_driver_ends_and_every_driver_beats(
    tmp_path: Path,
) -> None:
    """The drivers of one multi-node job share the lock: the one that joined keeps it alive
    after the first ends (before, only the first beat and released it, so a third job could take
    the dir 120 s after it ended while another node still trained)."""
    run_dir = tmp_path / "run"
    job = multi_node_job(run_dir, {"BLOCKS_RDZV_ENDPOINT": "node0:29500"})
    first = DirLock(run_dir, "hydra.run.dir", RUN_DIR_FIX, job=job, heartbeat_s=0.1)
    joined = DirLock(run_dir, "hydra.run.dir", RUN_DIR_FIX, job=job, heartbeat_s=0.1)
    first.acquire()
    joined.acquire()
    try:
        assert joined.joined
        first.release()
        assert (run_dir / LOCK_FILE).exists(), "a driver of the job still runs"
        with pytest.raises(DirBusy, match=f"pid {os.getpid()} on host {socket.gethostname()}"):
            DirLock(run_dir, "hydra.run.dir", RUN_DIR_FIX).acquire()
        beat = json.loads((run_dir / LOCK_FILE).read_text())["heartbeat"]
        deadline = time.monotonic() + 30
        while json.loads((run_dir / LOCK_FILE).read_text())["heartbeat"] == beat:
            assert time.monotonic() < deadline, "the joined driver never refreshed the heartbeat"
            time.sleep(0.05)
    finally:
        joined.release()
    assert not (run_dir / LOCK_FILE).exists(), "the last driver gives the lock back"

    # A member that died is dropped: the live one, releasing, is the last and removes the lock.
    dead = {"host": socket.gethostname(), "pid": 2**22 + 12345, "token": "dead", "heartbeat": time.time()}
    run_dir.mkdir(exist_ok=True)
    with spawned([sys.executable, "-c", "import time; time.sleep(600)"]) as node:
        live = {**dead, "pid": node.pid, "token": "live"}
        (run_dir / LOCK_FILE).write_text(json.dumps({**dead, "job": job, "members": [dead, live]}))
        with pytest.raises(DirBusy, match=f"pid {node.pid} on host"):  # the live member is named
            DirLock(run_dir, "hydra.run.dir", RUN_DIR_FIX).acquire()
        requeued = DirLock(run_dir, "hydra.run.dir", RUN_DIR_FIX, job=job)
        requeued.acquire()
        assert requeued.joined
        tokens = [m["token"] for m in json.loads((run_dir / LOCK_FILE).read_text())["members"]]
        assert tokens[0] == "live" and "dead" not in tokens and len(tokens) == 2
        requeued.release()
        assert [m["token"] for m in json.loads((run_dir / LOCK_FILE).read_text())["members"]] == ["live"]
