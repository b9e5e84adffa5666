"""Faults of processes and run dirs: killed launchers, preemption, exit codes, locks, refused reruns."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader, Dataset

from blocks.checkpoint import store
from blocks.launch import driver
from blocks.launch.lifeline import WORKER_NAME
from blocks.launch.lock import LOCK_FILE, RUN_DIR_FIX, DirBusy, DirLock
from blocks.launch.torchrun import multi_node_job, read_failures
from blocks.runtime.datamodule import outlive_stop_signals
from blocks.spec.errors import BlocksError
from tests.conftest import (
    DDP_BLOBS,
    FSDP_LM,
    REPO,
    alive,
    blocks_run_until_step,
    call_in_fresh_process,
    describe_process,
    free_port,
    job_pids,
    mlflow_logger,
    mlflow_statuses,
    parent_of,
    read_summary,
    run_cli,
    run_in_process,
    spawned,
)

pytestmark = pytest.mark.timeout(600)

LONG_DDP = [
    "recipe=blobs",
    "data.samples=200000",
    "trainer.max_epochs=5",
    "strategy=ddp",
    "trainer.devices=2",
    "monitor.log_every_n_steps=1",
]
TINY = ["recipe=blobs", "trainer.max_steps=5", "monitor.progress=off"]


def torchrun_pid(run_dir: Path) -> int:
    (pid,) = [
        p for p in job_pids(run_dir) if b"blocks.launch.torchrun" in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    return pid


def wait_until_gone(pids: list[int], patience_s: float = 90) -> list[str]:
    """Wait for *pids* to end; those still alive, described (orphans of a killed torchrun are no longer its descendants)."""
    deadline = time.monotonic() + patience_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [describe_process(pid) for pid in alive(pids)]


def snapshot(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(run_dir)): (path.stat().st_mtime_ns, path.stat().st_size)
        for path in run_dir.rglob("*")
        if path.is_file()
    }


@pytest.mark.slow
def test_workers_die_with_the_killed_blocks_run_group_and_a_second_job_is_refused_meanwhile(
    tmp_path: Path,
) -> None:
    """kill -9 of the ``blocks run`` process group; a second job into the held run dir is refused first."""
    run_dir = tmp_path / "run"
    with blocks_run_until_step([*LONG_DDP, f"hydra.run.dir={run_dir}"], cwd=tmp_path, step=5) as proc:
        # torchrun, two workers and torchrun's forkserver and resource tracker, in a session of their own
        assert len(job_pids(run_dir, workers_only=True)) == 2
        assert torchrun_pid(run_dir) in job_pids(run_dir)
        config_before = (run_dir / "config.yaml").read_bytes()
        second = run_in_process(
            ["run", *LONG_DDP, "trainer.max_epochs=1", f"hydra.run.dir={run_dir}"], cwd=tmp_path
        )
        assert second.returncode == 2, second.output
        assert f"pid {proc.pid}" in second.output and socket.gethostname() in second.output
        assert "Traceback" not in second.output
        assert (run_dir / "config.yaml").read_bytes() == config_before
        job = job_pids(run_dir)
        os.killpg(proc.pid, signal.SIGKILL)
        assert wait_until_gone(job) == []
    before = snapshot(run_dir)
    time.sleep(3)
    assert snapshot(run_dir) == before, "nothing writes into the run dir after the job died"


@pytest.mark.slow
def test_workers_die_with_a_killed_torchrun_and_the_summary_counts_what_happened(tmp_path: Path) -> None:
    """kill -9 of torchrun alone: the workers die too; the driver's summary has the real restarts and steps."""
    run_dir = tmp_path / "run"
    args = [*LONG_DDP, "trainer.max_failures=2", "checkpoint.every_n_steps=3", f"hydra.run.dir={run_dir}"]
    with blocks_run_until_step(args, cwd=tmp_path, step=8) as proc:
        job = job_pids(run_dir)
        os.kill(torchrun_pid(run_dir), signal.SIGKILL)
        assert wait_until_gone(job) == []
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 1, out[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "failed"
    assert summary["restarts"] == 0
    assert summary["global_step"] >= 6
    assert not (run_dir / LOCK_FILE).exists()


@pytest.mark.slow
def test_a_killed_peer_is_named_even_when_torchrun_sees_the_survivor_fail_first(tmp_path: Path) -> None:
    """torchrun reports the first failure it notices. Stopped while rank 1 is killed and rank 0
    fails on the broken connection, it notices rank 0's exit first (as a loaded machine made it
    do now and then); the reason must still name the rank that died, not only the symptom."""
    run_dir = tmp_path / "run"
    with blocks_run_until_step([*LONG_DDP, f"hydra.run.dir={run_dir}"], cwd=tmp_path, step=5) as proc:
        (agent,) = [
            pid
            for pid in job_pids(run_dir)
            if b"blocks.launch.torchrun" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        workers = job_pids(run_dir, workers_only=True)
        ranks = {
            int(Path(f"/proc/{pid}/comm").read_text().strip().removeprefix(WORKER_NAME)): pid
            for pid in workers
        }
        os.kill(agent, signal.SIGSTOP)
        try:
            os.kill(ranks[1], signal.SIGKILL)
            assert not wait_until_gone([ranks[0]]), "rank 0 did not fail on its broken connection"
        finally:
            os.kill(agent, signal.SIGCONT)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 1, out[-3000:]
    assert [(f["rank"], f["exitcode"]) for f in read_failures(run_dir)] == [(0, 1)]  # the survivor, first
    summary = read_summary(run_dir)
    assert summary["status"] == "failed"
    assert summary["reason"].startswith("rank 1 never exited: a signal ended it"), summary["reason"]
    assert "rank 0" not in summary["reason"].split(";")[0]


MULTI_PROCESS = {
    "ddp": (DDP_BLOBS, 30, "ddp_blobs_run", 20),
    "fsdp": (
        [
            *(arg for arg in FSDP_LM if arg != "monitor.progress=off"),
            "trainer.max_steps=8",
            "monitor.log_every_n_steps=1",
            "monitor.stall_timeout_s=120",
        ],
        8,
        "fsdp_sync_run",
        7,
    ),
}
"""The job each SIGTERM test stops (its overrides, its steps), the conftest fixture that trained it
uninterrupted, and the step after which rank 0 pauses (should the signal reach a rank late): on two
processes, every step logged, the stall watchdog armed (it hosts the fault hook the test sets; no stall
comes near its timeout). The fsdp job is :data:`FSDP_LM` for 8 steps, as ``fsdp_sync_run`` trained
it: logging and the watchdog change no weight, so their digests must agree. The pause is waited out
whenever the job stops at or after its step (the ranks check for the signal before the next step):
the 8-step fsdp job pauses after step 7, its last but one; the 30-step ddp job, whose console may
show step 5 when it is already at 7, after step 20 (after step 7 it waited 10 s for nothing)."""


@pytest.mark.slow
@pytest.mark.xdist_group(
    "torchrun"
)  # shares ddp_blobs_run with test_ray, fsdp_sync_run with the FSDP checkpoint tests
@pytest.mark.parametrize("strategy", sorted(MULTI_PROCESS))
def test_sigterm_to_a_multi_process_job_saves_on_every_rank_and_the_rerun_resumes_exactly(
    tmp_path: Path, strategy: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """With ddp, the SIGTERM reaches every process of the job at once (SLURM's scancel or preemption,
    systemd): torchrun, its forkserver and the ranks too. Regression: the forkserver died of it and took
    the ranks with it, and torchrun, signalled again by the driver, ended them mid-save: no checkpoint.
    With fsdp, only the driver gets it, and passes it on."""
    run_dir = tmp_path / "run"
    args, steps, uninterrupted, pause_after = MULTI_PROCESS[strategy]
    assert f"trainer.max_steps={steps}" in args and pause_after < steps
    # The signal goes at step 5; the ranks stop at the first step boundary by which they all got
    # it (they check every step: log_every_n_steps=1), 5 to 7. Should it reach a rank late on a
    # loaded machine, rank 0 pauses after step pause_after, so the job cannot finish first.
    monkeypatch.setenv("BLOCKS_FAULT_STALL", f"0:{pause_after}:10")
    with blocks_run_until_step([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path, step=5) as proc:
        signalled = [*job_pids(run_dir), proc.pid] if strategy == "ddp" else [proc.pid]
        assert strategy != "ddp" or torchrun_pid(run_dir) in signalled  # and its forkserver, the ranks
        for pid in signalled:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, out[-3000:]
    monkeypatch.delenv("BLOCKS_FAULT_STALL")
    assert "Traceback" not in out
    # torchrun, shutting down, never reads the finished workers' results: they must end by
    # themselves, not wait 30 s of a preemption's grace period for its SIGKILL
    assert "forcefully exiting" not in out, out[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted", summary
    assert "SIGTERM" in summary["reason"]
    assert 5 <= summary["global_step"] < steps
    committed, _ = store.scan(str(run_dir / "checkpoints"))
    periodic = [4] if "checkpoint.every_n_steps=4" in args else []  # FSDP_LM's; DDP_BLOBS' every_n_steps=0
    assert [c.manifest.step for c in committed] == [*periodic, summary["global_step"]]  # the signal saved
    rerun = run_in_process(["run", *args, "monitor.progress=off", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert rerun.returncode == 0, rerun.output[-3000:]
    resumed = read_summary(run_dir)
    assert resumed["status"] == "completed" and resumed["global_step"] == steps
    assert resumed["resumed_from"].endswith(store.step_dir_name(summary["global_step"]))
    expected = read_summary(request.getfixturevalue(uninterrupted))["state_digest"]
    assert expected and resumed["state_digest"] == expected


def listening(port: int) -> bool:
    """Whether something on loopback accepts connections on *port*."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_torchrun_starts_or_waits_for_the_other_nodes_interrupts_the_job(
    tmp_path: Path, signum: int
) -> None:
    """Regression: a SIGTERM that reached torchrun before it handled signals (importing, or at the rendezvous)
    killed it, and a SIGINT while its interpreter started ended it with status 1: the job ended `failed`
    with status 1, which a requeue script does not requeue, and one at the rendezvous hung. An earlier run's metrics.csv in the run dir is
    not this job's progress (it was reported as its step, with a checkpoint to resume that did not exist)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("step,train/loss\n20,0.5\n")  # an earlier run's, with no checkpoint
    args = [*TINY, "strategy=ddp", "trainer.nodes=2", "trainer.devices=1", f"hydra.run.dir={run_dir}"]
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BLOCKS_RDZV_ENDPOINT": f"127.0.0.1:{port}"}
    with spawned(
        [sys.executable, "-m", "blocks", "run", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        deadline = time.monotonic() + 120
        while not job_pids(run_dir) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if signum == signal.SIGINT:  # at the rendezvous: a KeyboardInterrupt waited there for minutes
            while not listening(port) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)  # torchrun hosts the rendezvous's store on the endpoint once it is there
        proc.send_signal(signum)  # no second node ever comes: torchrun is before its workers
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    if signum == signal.SIGTERM:  # a SIGINT in torchrun's start-up may make its interpreter print one
        assert "Traceback" not in out, out[-3000:]
    summary = read_summary(run_dir)
    assert (summary["status"], summary["global_step"]) == ("interrupted", 0), summary
    name = signal.Signals(signum).name
    assert summary["reason"].startswith(f"{name} stopped the job before its workers wrote a summary"), summary
    assert "nothing was trained or saved" in summary["reason"], summary


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_one_process_interrupted_exits_130_without_a_traceback_and_the_rerun_resumes_its_save(
    tmp_path: Path, signum: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal ends the run as interrupted, with exit status 130 and a checkpoint of the step it
    stopped at; a rerun (in this process, as test_checkpoint's reruns) resumes from that checkpoint.

    The signal goes to the whole process group, as preemption (SLURM, systemd) and Ctrl-C send it,
    so the DataLoader workers get it too. Regression: a SIGTERM killed them and the run failed on
    the dead worker without saving; a SIGINT ran the handler they inherited, announcing it thrice.
    A second Ctrl-C comes as the process exits. Regression: it printed a traceback, or (once the
    interpreter was finalizing) the process died of it.
    """
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    again = ["trainer.callbacks=[{_target_: tests.lightning_habits.CtrlCAgainAtExit}]"]
    run_dir = tmp_path / "run"
    args = [
        "recipe=blobs",
        "data.samples=200000",
        "data.num_workers=2",
        "trainer.max_epochs=5",
        "monitor.log_every_n_steps=1",
    ]
    first = [*args, *(again if signum == signal.SIGINT else []), f"hydra.run.dir={run_dir}"]
    with blocks_run_until_step(first, cwd=tmp_path, step=3) as proc:
        os.killpg(proc.pid, signum)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert out.count(f"{signal.Signals(signum).name} received") == 1, out[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted" and summary["global_step"] >= 3
    assert signal.Signals(signum).name in summary["reason"]
    committed, _ = store.scan(str(run_dir / "checkpoints"))
    assert committed[-1].manifest.step == summary["global_step"]
    shorter = ["trainer.max_epochs=null", f"trainer.max_steps={summary['global_step'] + 2}"]
    rerun = run_in_process(["run", *args, *shorter, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert rerun.returncode == 0, rerun.output[-3000:]
    assert read_summary(run_dir)["resumed_from"] == committed[-1].url


def stopped_by(signum: int, start: Any) -> int:
    """The signal that ended a process *start()* made after *signum* was sent to it (0: it lived on for 3 s)."""
    pid = start()
    os.kill(pid, signum)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return 0


def forked_sleeper() -> int:
    """A process forked from this one that sleeps 30 s."""
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    return pid


def thread_then_outlive_stop_signals(worker_id: int) -> None:
    """:func:`outlive_stop_signals` in a worker that already runs a second thread (as torch's or a dataset's)."""
    threading.Thread(target=time.sleep, args=(60,), name="earlier", daemon=True).start()
    outlive_stop_signals(worker_id)


class StartsChildren(Dataset):
    """Sample i is i; sample 0 also carries the signals that ended the processes its worker started,
    and the id of the worker's thread that was running before its ``worker_init_fn`` (0: none)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> list[int]:
        if index:
            return [index, 0, 0, 0, 0]
        program = lambda: subprocess.Popen(["sleep", "30"]).pid  # noqa: E731
        earlier = next((thread.native_id for thread in threading.enumerate() if thread.name == "earlier"), 0)
        stopped = [stopped_by(signal.SIGINT, program), stopped_by(signal.SIGTERM, program)]
        return [index, *stopped, stopped_by(signal.SIGTERM, forked_sleeper), earlier]


def test_a_loader_worker_outlives_the_jobs_stop_signals_but_ends_at_its_loaders_sigterm() -> None:
    """torch's loader sends SIGTERM to a worker that did not exit when told (one stuck in a read):
    a worker that drops the job's SIGTERM must still end at that one, or the process never exits.

    The processes a worker starts take the stop signals as usual. Regressions: a program the
    dataset ran ignored SIGINT, then SIGTERM (a ``kill -- -PGID`` left it running), and a forked
    process ignored both; a SIGTERM that the kernel gave to a thread the worker ran before its
    ``worker_init_fn`` ended the worker (the kernel picks any thread that does not block it)."""
    iterators = [
        iter(DataLoader(StartsChildren(), num_workers=1, persistent_workers=True, worker_init_fn=init_fn))
        for init_fn in (outlive_stop_signals, thread_then_outlive_stop_signals)
    ]
    try:
        for iterator in iterators:
            *sample, earlier = [column.item() for column in next(iterator)]
            assert sample == [0, signal.SIGINT, signal.SIGTERM, signal.SIGTERM]
            (worker,) = iterator._workers  # type: ignore[attr-defined]
            # From another process, as preemption and Ctrl-C send them. A signal sent to a thread's
            # id goes to the whole process, but to that thread first if it does not block the signal.
            for name, to in (("TERM", worker.pid), ("INT", worker.pid), ("TERM", earlier or worker.pid)):
                subprocess.run(["kill", f"-{name}", str(to)], check=True)
            time.sleep(0.5)
            assert worker.is_alive()
            assert [column.item() for column in next(iterator)] == [1, 0, 0, 0, 0]
            # from its parent, after the event, as the loader's shutdown sends it; with no earlier
            # thread the worker's SIGTERM thread takes it, else the earlier thread (a handler)
            iterator._workers_done_event.set()  # type: ignore[attr-defined]
            os.kill(earlier or worker.pid, signal.SIGTERM)
            worker.join(timeout=30)
            assert worker.exitcode == 0
    finally:
        for iterator in iterators:
            iterator._shutdown_workers()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert driver.run(TINY, run_dir).status == "completed"
    return run_dir


def test_a_refused_rerun_leaves_the_finished_run_dir_as_it_was(finished: Path) -> None:
    before = {name: (finished / name).read_bytes() for name in ("config.yaml", "plan.json", "summary.json")}
    with pytest.raises(BlocksError, match="global batch"):
        driver.run([*TINY, "data.batch_size=7"], finished)  # its checkpoint has another global batch
    assert {name: (finished / name).read_bytes() for name in before} == before
    assert not (finished / LOCK_FILE).exists()


def write_lock(run_dir: Path, **holder: object) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    content = {"host": socket.gethostname(), "pid": os.getpid(), "started": "then", "heartbeat": time.time()}
    (run_dir / LOCK_FILE).write_text(json.dumps({**content, **holder}))


def test_a_run_dir_held_by_a_live_job_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's driver of a multi-node job is refused too (it took no lock, resumed the live job's
    checkpoints and replaced its config.yaml), before torchrun waits for the other node."""
    monkeypatch.setenv("BLOCKS_RDZV_ENDPOINT", f"127.0.0.1:{free_port()}")
    multi_node = [*TINY, "strategy=ddp", "trainer.nodes=2", "trainer.devices=1", "data.batch_size=16"]
    with spawned([sys.executable, "-c", "import time; time.sleep(600)"]) as holder:
        write_lock(tmp_path / "run", pid=holder.pid)
        for args in (TINY, multi_node):
            with pytest.raises(DirBusy) as refused:
                driver.run(args, tmp_path / "run")
            problem = refused.value.problems[0]
            assert problem.key == "hydra.run.dir"
            assert f"pid {holder.pid} on host {socket.gethostname()}" in problem.message
            assert "choose another hydra.run.dir" in problem.fix
            assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [LOCK_FILE]


def test_the_drivers_of_one_multi_node_job_share_its_run_dir_lock_and_any_other_job_is_refused(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    job = multi_node_job(run_dir, {"BLOCKS_RDZV_ENDPOINT": "node0:29500"})
    first = DirLock(run_dir, "hydra.run.dir", RUN_DIR_FIX, job=job)
    first.acquire()
    try:
        # the other node's driver joins, naming the first node otherwise (its full name, its address)
        same = multi_node_job(run_dir, {"BLOCKS_RDZV_ENDPOINT": "node0.cluster.example:29500"})
        second = DirLock(run_dir, "hydra.run.dir", RUN_DIR_FIX, job=same)
        second.acquire()
        assert second.joined and not first.joined
        second.release()
        assert (run_dir / LOCK_FILE).exists(), "the first driver still holds it"
        other = multi_node_job(run_dir, {"BLOCKS_RDZV_ENDPOINT": "node1:29611"})
        with pytest.raises(DirBusy):  # another multi-node job
            DirLock(run_dir, "hydra.run.dir", RUN_DIR_FIX, job=other).acquire()
        with pytest.raises(DirBusy):  # a single-node job
            driver.run(TINY, run_dir)
    finally:
        first.release()
    assert not (run_dir / LOCK_FILE).exists()


@pytest.mark.parametrize(
    "holder",
    [
        {"pid": 2**22 + 12345},  # no such process on this host
        {"host": "elsewhere", "heartbeat": time.time() - 3600},  # another host, no heartbeat for an hour
    ],
    ids=["dead-pid", "old-heartbeat"],
)
def test_a_stale_lock_is_taken_over_with_a_warning_and_released_at_the_end(
    tmp_path: Path, holder: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    write_lock(tmp_path / "run", **holder)
    assert driver.run(TINY, tmp_path / "run").status == "completed"
    assert "stale lock" in caplog.text
    assert not (tmp_path / "run" / LOCK_FILE).exists()


def test_a_failed_job_does_not_end_a_sweep_and_the_sweep_exits_1(cli_in_process, tmp_path: Path) -> None:
    """Through the CLI entry in this process: Hydra's basic launcher runs the jobs in the sweep's own process.

    Then two more sweeps into the same sweep dir. Each job resumed whatever job had its number
    before: job 0 of ``optim.lr=1e-2,1e-3`` resumed lr=1e12's run, reported its result and
    overwrote its config.yaml. Now a job whose swept values differ from its run dir's job is
    refused, and nothing of that job is touched; a job with the same values resumes, also with
    a longer ``trainer.max_steps``. And a sweep is judged by its own jobs only: one that
    completes exits 0, however many failed summaries an earlier sweep left in the sweep dir.
    """
    sweep = tmp_path / "sweep"
    result = cli_in_process(
        "run", "-m", "recipe=blobs", "trainer.max_steps=20", "optim.lr=1e12,1e-3", f"hydra.sweep.dir={sweep}"
    )
    assert result.returncode == 1, result.output[-3000:]
    assert "Traceback" not in result.output
    assert read_summary(sweep / "0")["status"] == "failed"  # diverged: NaN loss
    assert read_summary(sweep / "1")["status"] == "completed"  # ran after the failure
    assert f"1 job(s) of the sweep did not complete: {sweep / '0'}" in result.output
    assert cli_in_process("report", str(sweep)).returncode == 0
    report = (sweep / "report" / "report.md").read_text()
    assert "| failed |" in report and "| completed |" in report

    diverged = read_summary(sweep / "0")
    config = (sweep / "0" / "config.yaml").read_text()
    other = [
        "run",
        "-m",
        "recipe=blobs",
        "trainer.max_steps=30",
        "optim.lr=1e-2,1e-3",
        f"hydra.sweep.dir={sweep}",
    ]
    result = cli_in_process(*other)
    assert result.returncode == 1, result.output[-3000:]
    assert f"hydra.sweep.dir: {sweep / '0'} holds another job, of an earlier sweep" in result.output
    assert "optim.lr=1000000000000.0 there, 0.01 here" in result.output
    assert "fix: sweep into a new hydra.sweep.dir" in result.output
    assert f"1 job(s) of the sweep did not complete: {sweep / '0'} (refused" in result.output
    assert read_summary(sweep / "0") == diverged and (sweep / "0" / "config.yaml").read_text() == config
    assert f"resuming from step 20 of {sweep / '1' / 'checkpoints'}" in result.output  # the same job, longer
    assert read_summary(sweep / "1")["global_step"] == 30

    one_job = ["run", "-m", "recipe=blobs", "trainer.max_steps=30", "optim.lr=1e-3", "hydra.sweep.subdir=1"]
    result = cli_in_process(*one_job, f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.output[-3000:]
    assert "did not complete" not in result.output

    # A finished job rerun with a changed setting and nothing left to train is refused, and its
    # record stays (it was replaced by a "failed" summary of the refusal).
    finished = read_summary(sweep / "1")
    result = cli_in_process(*one_job, "optim.weight_decay=0.05", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 1, result.output[-3000:]
    assert f"{sweep / '1'} (refused before it started" in result.output
    assert read_summary(sweep / "1") == finished


# A sweep hearing of its jobs in joblib's processes, and of no earlier sweep's: test_security's joblib sweep.


def test_a_sweep_whose_jobs_land_in_several_sweep_dirs_counts_each_of_them(
    cli_in_process, tmp_path: Path
) -> None:
    """The default sweep dir names the recipe, so a sweep over recipes puts its jobs in several
    dirs: the failed jobs were looked for in one of them only, and the sweep exited 0. Each job
    names its own sweep dir, not its run dir's parent (the subdir here has two levels)."""
    result = cli_in_process(
        "run",
        "-m",
        "recipe=blobs,digits_mlp",
        "trainer.max_steps=3",
        "optim.lr=1e30",
        "monitor.progress=off",
        "hydra.sweep.subdir=job/${hydra.job.num}",
    )
    assert result.returncode == 1, result.output[-3000:]
    blobs, digits = (next((tmp_path / "multirun" / recipe).iterdir()) for recipe in ("blobs", "digits_mlp"))
    assert f"2 job(s) of the sweep did not complete: {blobs / 'job/0'}, {digits / 'job/1'}" in result.output
    (said,) = [line for line in result.output.splitlines() if line.startswith("sweep dir")]
    assert said.startswith(
        f"sweep dirs: {blobs}, {digits} (its multirun.yaml is in {tmp_path / 'multirun'}/"
    ), said


@pytest.mark.slow
def test_a_diverging_trial_does_not_end_an_optuna_study(cli_in_process, tmp_path: Path) -> None:
    """Through the CLI entry in this process: the Optuna sweeper runs its trials with the basic launcher."""
    sweep = tmp_path / "optuna"
    study = ["run", "-m", "hparams_search=optuna", "recipe=blobs", "trainer.max_steps=20"]
    result = cli_in_process(
        *study, "hydra.sweeper.n_trials=4", "optim.lr=choice(1e12,1e-3)", f"hydra.sweep.dir={sweep}"
    )
    assert result.returncode == 1, result.output[-3000:]
    statuses = [read_summary(sweep / str(n))["status"] for n in range(4)]
    assert "failed" in statuses and "completed" in statuses
    best = (sweep / "optimization_results.yaml").read_text()
    assert "optim.lr: 0.001" in best

    # Another study into the same sweep dir numbers its trials from 0 again: each resumed the
    # first study's trial of its number, and best_params came with another trial's value.
    summaries = [read_summary(sweep / str(n)) for n in range(2)]
    result = cli_in_process(
        *study, "hydra.sweeper.n_trials=2", "hydra.sweeper.sampler.seed=7", f"hydra.sweep.dir={sweep}"
    )
    assert result.returncode == 1, result.output[-3000:]
    assert result.output.count("holds another job, of an earlier sweep") == 2
    assert (
        "resuming" not in result.output
        and "best_value: .inf" in (sweep / "optimization_results.yaml").read_text()
    )
    assert [read_summary(sweep / str(n)) for n in range(2)] == summaries

    # Its trials are not known in advance, so trials sharing a run dir are refused as they start.
    result = cli_in_process(
        "run",
        "-m",
        "hparams_search=optuna",
        "recipe=blobs",
        "trainer.max_steps=5",
        "hydra.sweeper.n_trials=2",
        f"hydra.sweep.dir={tmp_path / 'shared'}",
        "hydra.sweep.subdir=same",
    )
    assert result.returncode == 1, result.output[-3000:]
    assert f"hydra.sweep.subdir: jobs 0 and 1 of this sweep both run in {tmp_path / 'shared' / 'same'}" in (
        result.output
    )
    assert read_summary(tmp_path / "shared" / "same")["status"] == "completed"  # trial 0's


GRACE_S, OUTLIVED_S = 1, 2.5
"""The ``trainer.shutdown_grace_s`` of the runs stopped by SIGTERM in a fresh process, and how long that
process goes on after each of them ended (past the grace: a grace timer that fired would end it)."""


def stop_an_in_process_run_by_sigterm_and_outlive_the_grace(
    run_dir: str, *extra: str, ended: list[float]
) -> str:
    """In a fresh process: ``driver.run`` gets SIGTERM mid-training; the process goes on past the grace.

    The time the run ended is appended to *ended*: the caller goes on at least :data:`OUTLIVED_S`
    after it, running what comes next meanwhile.
    """
    import threading

    def signal_once_training() -> None:
        while not (Path(run_dir) / "metrics.csv").exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_once_training, daemon=True).start()
    args = [
        "recipe=blobs",
        "trainer.max_steps=100000",
        "trainer.max_epochs=null",
        "monitor.log_every_n_steps=1",
    ]
    try:
        driver.run(
            [*args, *extra, "monitor.progress=off", f"trainer.shutdown_grace_s={GRACE_S}"], Path(run_dir)
        )
    except driver.JobFailed as stopped:
        ended.append(time.monotonic())  # outlived past trainer.shutdown_grace_s: it must not end this process
        return str(stopped)
    return "not stopped"


def stop_an_in_process_run_by_sigterm_in_setup(run_dir: str) -> dict[str, Any]:
    """In a fresh process: ``driver.run`` gets SIGTERM while Lightning sets the run up; what it says after."""
    os.environ["BLOCKS_ALLOW_IMPORTS"] = "tests"
    callback = "trainer.callbacks=[{_target_: tests.lightning_habits.SignalAtSetup}]"
    try:
        driver.run(["recipe=blobs", "trainer.max_steps=20", "monitor.progress=off", callback], Path(run_dir))
        outcome = "not stopped"
    except driver.JobFailed as stopped:
        outcome = str(stopped)
    return {"outcome": outcome, "handler_back": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}


VAL_EVERY, STOPPED_AT, RESUMED_TO = 4, 5, 12


def stop_an_in_process_run_by_sigterm_at_a_step_and_resume(
    run_dir: str, accumulate: int, *, mlflow: bool = False
) -> dict[str, Any]:
    """In a fresh process: a run SIGTERMed once step :data:`STOPPED_AT` is done, then the same command again.

    What each said, and the steps of the ``metrics.csv`` rows with validation metrics; with
    *mlflow*, the statuses of its MLflow runs after the stop and after the resume.
    """
    os.environ["BLOCKS_ALLOW_IMPORTS"] = "tests"
    args = [
        "recipe=blobs",
        f"trainer.max_steps={RESUMED_TO}",
        "trainer.max_epochs=null",
        f"trainer.val_every={VAL_EVERY}",
        f"data.batch_size={64 // accumulate}",
        f"optim.accumulate={accumulate}",
        "monitor.progress=off",
        f"trainer.callbacks=[{{_target_: tests.lightning_habits.SignalAtStep, step: {STOPPED_AT}}}]",
    ]
    database = Path(run_dir).parent / f"mlflow-{Path(run_dir).name}.db"
    if mlflow:
        args.append(mlflow_logger(database, "stopped"))
    try:
        driver.run(args, Path(run_dir))
        stopped = "not stopped"
    except driver.JobFailed as stop:
        stopped = str(stop)
    status_when_stopped = mlflow_statuses(database, "stopped") if mlflow else None
    resumed = driver.run(args, Path(run_dir))
    with open(Path(run_dir) / "metrics.csv", newline="") as fh:
        validated = [int(row["step"]) for row in csv.DictReader(fh) if row.get("val/loss")]
    return {
        "stopped": stopped,
        "status": resumed.status,
        "resumed_from": read_summary(Path(run_dir))["resumed_from"],
        "validated": validated,
        "mlflow": (status_when_stopped, mlflow_statuses(database, "stopped")) if mlflow else None,
    }


def stop_an_in_process_run_by_ctrl_c_twice(run_dir: str, habit: str = "SignalTwiceInStep") -> str:
    """In a fresh process: ``driver.run`` gets Ctrl-C twice (by default in the middle of step 4; *habit*
    from :mod:`tests.lightning_habits` says when); what it says after."""
    os.environ["BLOCKS_ALLOW_IMPORTS"] = "tests"
    callback = f"trainer.callbacks=[{{_target_: tests.lightning_habits.{habit}, step: 3}}]"
    try:
        driver.run(["recipe=blobs", "trainer.max_steps=20", "monitor.progress=off", callback], Path(run_dir))
    except driver.JobFailed as stopped:
        return str(stopped)
    return "not stopped"


def stop_in_process_runs_by_sigterm(root: str) -> dict[str, Any]:
    """Three runs stopped by SIGTERM one after the other in one process (cells of a notebook): two as
    :func:`stop_an_in_process_run_by_sigterm_and_outlive_the_grace` (the default's outcome and
    ``checkpoint.resume=never``'s), then one as :func:`stop_an_in_process_run_by_sigterm_in_setup`;
    two as :func:`stop_an_in_process_run_by_ctrl_c_twice` (mid-step, and while saving); then runs stopped at a step and resumed, as
    :func:`stop_an_in_process_run_by_sigterm_at_a_step_and_resume` (``resumed/<accumulate>``).

    The process outlives each grace run's grace while it runs the others (it goes on at least
    :data:`OUTLIVED_S` after the last one ended, sleeping what the later runs did not take)."""
    ended: list[float] = []
    outcomes = {
        "default": stop_an_in_process_run_by_sigterm_and_outlive_the_grace(
            str(Path(root) / "default"), ended=ended
        ),
        "never": stop_an_in_process_run_by_sigterm_and_outlive_the_grace(
            str(Path(root) / "never"), "checkpoint.resume=never", ended=ended
        ),
        "setup": stop_an_in_process_run_by_sigterm_in_setup(str(Path(root) / "setup")),
        "twice": stop_an_in_process_run_by_ctrl_c_twice(str(Path(root) / "twice")),
        "twice_saving": stop_an_in_process_run_by_ctrl_c_twice(
            str(Path(root) / "twice_saving"), "SignalAgainWhileSaving"
        ),
        "resumed": {
            str(accumulate): stop_an_in_process_run_by_sigterm_at_a_step_and_resume(
                str(Path(root) / f"resumed{accumulate}"), accumulate, mlflow=accumulate == 1
            )
            for accumulate in (1, 2)
        },
    }
    time.sleep(max(0.0, max(ended) + OUTLIVED_S - time.monotonic()))  # past each grace run's grace
    return outcomes


@pytest.fixture(scope="module")
def stopped_in_process(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The root of :func:`stop_in_process_runs_by_sigterm`'s run dirs, and its outcomes, from a fresh process.

    Each run's grace timer must spare the process: one that fired would end it during or
    after the second run, and the fresh process would fail.
    """
    root = tmp_path_factory.mktemp("stopped")
    return root, call_in_fresh_process(stop_in_process_runs_by_sigterm, str(root))


def test_the_shutdown_grace_ends_with_the_run_not_with_the_process_that_ran_it(
    stopped_in_process: tuple[Path, dict[str, Any]],
) -> None:
    """Regression: the grace timer of a SIGTERM'd in-process run killed the notebook that ran it, seconds later."""
    root, outcomes = stopped_in_process
    outcome = outcomes["default"]
    assert "the job ended with status 'interrupted': SIGTERM stopped training" in outcome
    assert f"to resume, run the same command with hydra.run.dir={root / 'default'}" in outcome.replace(
        "\n", ""
    )


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_run_resumed_from_its_signal_checkpoint_validates_at_the_uninterrupted_steps(
    stopped_in_process: tuple[Path, dict[str, Any]], accumulate: int
) -> None:
    """Regression: the checkpoint a SIGTERM saved counted the next micro-batch as done; resumed from it,
    every validation came one micro-batch early (at steps 7 and 11 instead of 8 and 12 here)."""
    _, outcomes = stopped_in_process
    said = outcomes["resumed"][str(accumulate)]
    assert f"SIGTERM stopped training at step {STOPPED_AT}" in said["stopped"], said
    assert said["status"] == "completed", said
    assert said["resumed_from"].endswith(store.step_dir_name(STOPPED_AT)), said
    assert said["validated"] == list(range(VAL_EVERY, RESUMED_TO + 1, VAL_EVERY)), said


def test_an_interrupted_run_ends_its_mlflow_run_killed_and_its_resume_finished(
    stopped_in_process: tuple[Path, dict[str, Any]],
) -> None:
    """Regression: blocks finalized every logger run as a success after Lightning had marked it failed, so
    MLflow showed a SIGTERMed run FINISHED (and a failed one too, see test_monitor)."""
    _, outcomes = stopped_in_process
    assert outcomes["resumed"]["1"]["mlflow"] == [["KILLED"], ["FINISHED"]]


def test_a_signal_while_the_run_sets_up_stops_it_with_a_summary(
    stopped_in_process: tuple[Path, dict[str, Any]],
) -> None:
    """A SIGTERM before Lightning's loop installed its handlers ended the process as signalled, no summary written."""
    root, outcomes = stopped_in_process
    said = outcomes["setup"]
    stopped = (
        "the job ended with status 'interrupted': SIGTERM stopped training at step 0, before its first step"
    )
    assert stopped in said["outcome"], said
    assert "nothing was trained or saved; run the same command to start it" in said["outcome"], said
    assert said["handler_back"], "the process that ran it gets its own SIGTERM handling back"
    summary = read_summary(root / "setup")
    assert (summary["status"], summary["global_step"]) == ("interrupted", 0)


def test_a_second_ctrl_c_stops_at_once_without_saving_a_half_made_step(
    stopped_in_process: tuple[Path, dict[str, Any]],
) -> None:
    """Regression: a second Ctrl-C, which comes mid-step (here between backward and the optimizer's update),
    saved a checkpoint there, although the docs say it stops at once without saving."""
    root, outcomes = stopped_in_process
    assert "a second SIGINT stopped training at once, after step 3, without saving" in outcomes["twice"]
    summary = read_summary(root / "twice")
    assert (summary["status"], summary["global_step"]) == ("interrupted", 3)
    committed, _ = store.scan(str(root / "twice" / "checkpoints"))
    assert committed == [], "the last checkpoint stands: none before step 3 here"


def test_a_second_ctrl_c_while_saving_says_the_save_was_interrupted(
    stopped_in_process: tuple[Path, dict[str, Any]],
) -> None:
    """Regression: a second Ctrl-C that interrupted the checkpoint the first one stopped at was reported
    as "its checkpoint was saved"; no checkpoint of that step was committed."""
    root, outcomes = stopped_in_process
    said = outcomes["twice_saving"]
    assert "SIGINT stopped training at step 3; a second SIGINT interrupted its save" in said, said
    assert "to go on from its last checkpoint" in said and "was saved" not in said, said
    summary = read_summary(root / "twice_saving")
    assert (summary["status"], summary["global_step"]) == ("interrupted", 3)
    committed, _ = store.scan(str(root / "twice_saving" / "checkpoints"))
    assert committed == []


def test_a_signal_after_the_last_step_still_ends_the_process_and_its_sweep(tmp_path: Path) -> None:
    """A SIGTERM that came after training's last step boundary stopped nothing and was swallowed: the sweep went on."""
    sweep = tmp_path / "sweep"
    result = run_cli(
        [
            "run",
            "-m",
            *TINY,
            "trainer.seed=1,2",
            "trainer.callbacks=[{_target_: tests.lightning_habits.SignalAtTrainEnd}]",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        env={"BLOCKS_ALLOW_IMPORTS": "tests", "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == -signal.SIGTERM, result.output[-3000:]
    assert read_summary(sweep / "0")["status"] == "completed", "the run itself had finished"
    assert not (sweep / "1").exists(), "the sweep stopped with its process"


def test_an_interrupted_run_says_the_command_that_resumes_it(
    stopped_in_process: tuple[Path, dict[str, Any]],
) -> None:
    """Rerun as told ("run the same command again"), a run started with ``checkpoint.resume=never``
    (or a URL) started over and deleted the checkpoint the interruption saved; and under the
    default, timestamped run dir, the same command starts a new run. The reason names both."""
    root, outcomes = stopped_in_process
    expected = f"run the same command with hydra.run.dir={root / 'never'} and checkpoint.resume=auto"
    assert expected in outcomes["never"].replace("\n", ""), outcomes["never"]


@pytest.mark.slow
def test_a_killed_rank_is_restarted_from_its_own_checkpoints_not_an_earlier_runs(tmp_path: Path) -> None:
    """A run started with ``checkpoint.resume=never`` where an earlier run left checkpoints up to
    step 60: killed after its own step-5 save, its restart resumed the earlier run's step 60
    (its own work thrown away, another run's weights taken; it then ended at 60, past its own
    max_steps of 40). It resumes one of its own checkpoints now, whenever the kill lands.

    Two ranks: rank 0 waits in its all-reduce once rank 1 is killed. The restarted workers are
    forked from the server that imported torch and Lightning once, and the failed attempt's
    summary does not say "failed" while the restarted one trains.

    The earlier run trains on one process, in this one: it only has to leave another job's
    checkpoints in the run dir (resumed on two processes, its step 60 would end the restart at 60
    or fail it; either fails this test), and a 2-process job's start is what costs here."""
    run_dir = tmp_path / "run"
    every_5 = ["recipe=blobs", "data.samples=200000", "checkpoint.every_n_steps=5", "checkpoint.keep_last=20"]
    every_5 += ["trainer.val_every=null"]
    earlier = driver.run([*every_5, "trainer.max_steps=60", "monitor.progress=off"], run_dir)
    assert earlier.status == "completed" and earlier.world_size == 1
    step_5 = str(run_dir / "checkpoints" / store.step_dir_name(5))
    earlier_job = store.read_manifest(step_5).job

    again = [*every_5, "strategy=ddp", "trainer.devices=2", "trainer.max_steps=40"]
    again += ["checkpoint.resume=never", "trainer.max_failures=1"]
    with blocks_run_until_step(
        [*again, "monitor.log_every_n_steps=1", f"hydra.run.dir={run_dir}"], cwd=tmp_path, step=6
    ) as proc:
        deadline = time.monotonic() + 120
        while not saved_again(step_5, earlier_job):
            assert time.monotonic() < deadline, "the second run never saved its step 5"
            time.sleep(0.2)
        victims = job_pids(run_dir, workers_only=True)
        assert len(victims) == 2
        forkserver = parent_of(victims[0])
        assert b"forkserver" in Path(f"/proc/{forkserver}/cmdline").read_bytes()
        os.kill(victims[-1], signal.SIGKILL)
        restarted: set[int] = set()
        while proc.poll() is None and len(restarted) < 2:
            restarted = set(job_pids(run_dir, workers_only=True)) - set(victims)
            time.sleep(0.05)
        assert {parent_of(pid) for pid in restarted} == {forkserver}
        attempt = run_dir / ".attempt"  # rank 0 of the restarted attempt writes it once it is running
        while proc.poll() is None and not (attempt.exists() and attempt.read_text() == "1"):
            time.sleep(0.05)
        running = read_summary(run_dir)["status"] if (run_dir / "summary.json").exists() else None
        assert running in (None, "completed"), running
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    assert summary["restarts"] == 1 and summary["global_step"] == 40
    resumed_step = int(Path(summary["resumed_from"]).name.rsplit("-", 1)[1])
    assert 5 <= resumed_step < 40, summary["resumed_from"]


def saved_again(url: str, job: str) -> bool:
    """Whether the checkpoint at *url* is committed and was saved by another job than *job*."""
    try:
        return store.read_manifest(url).job != job
    except store.CheckpointError:
        return False  # being replaced


def test_the_resume_advice_fits_a_sweep_job_and_a_run_without_checkpoints(tmp_path: Path) -> None:
    """Under ``-m`` Hydra ignores ``hydra.run.dir`` (a sweep job's run dir comes from the sweep's),
    and a run with checkpointing off saved nothing to resume from."""
    from blocks.core import jobs
    from blocks.launch.worker import SWEEP_CONFIG, interruption_reason

    (tmp_path / "sweep" / "3").mkdir(parents=True)
    (tmp_path / "sweep" / SWEEP_CONFIG).write_text("{}")
    plan = jobs.plan(["recipe=blobs"])
    reason = interruption_reason(None, 7, plan, tmp_path / "sweep" / "3")
    assert f"to resume, run the same sweep with hydra.sweep.dir={tmp_path / 'sweep'}" in reason
    off = jobs.plan(["recipe=blobs", "checkpoint.enabled=false"])
    reason = interruption_reason(None, 7, off, tmp_path / "run")
    assert "checkpointing is off (checkpoint.enabled=false), so it cannot resume" in reason
    assert "to resume" not in reason


def test_a_node_whose_peers_never_come_says_what_it_waits_for_and_gives_up_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """One node of two started (the other failed before the rendezvous): it says once what it
    waits for, and after BLOCKS_RDZV_TIMEOUT_S ends with an error naming what to check (before,
    nothing was printed for torchrun's 600 s, then a failure 'with status 1 without a summary')."""
    endpoint = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("BLOCKS_RDZV_ENDPOINT", endpoint)
    monkeypatch.setenv("BLOCKS_RDZV_TIMEOUT_S", "1")
    run_dir = tmp_path / "run"
    args = [*TINY, "strategy=ddp", "trainer.nodes=2", "trainer.devices=1", f"hydra.run.dir={run_dir}"]
    result = run_in_process(["run", *args], cwd=tmp_path)
    assert result.returncode == 1, result.output[-3000:]
    assert result.output.count(f"waiting for 2 nodes at {endpoint}") == 1, result.output[-3000:]
    assert "gives up after 1 s: BLOCKS_RDZV_TIMEOUT_S" in result.output
    torchrun = capfd.readouterr().err  # torchrun's own output, not the driver's
    assert "Traceback" not in result.output + torchrun and "RendezvousTimeoutError" in torchrun
    summary = read_summary(run_dir)
    assert summary["status"] == "failed" and summary["global_step"] == 0
    assert f"did not all meet at the rendezvous at {endpoint} within 1 s" in summary["reason"]
    assert "the other nodes' output" in summary["reason"] and summary["reason"] in result.output

    config = (run_dir / "config.yaml").read_text()
    for unusable in ({"BLOCKS_RDZV_TIMEOUT_S": "-5"}, {"BLOCKS_RDZV_ENDPOINT": ""}):
        for name, value in unusable.items():
            monkeypatch.setenv(name, value)
        refused = run_in_process(["run", *args, "trainer.max_steps=7"], cwd=tmp_path)
        assert refused.returncode == 2, refused.output[-3000:]
        assert (
            "BLOCKS_RDZV_TIMEOUT_S='-5'" if "BLOCKS_RDZV_TIMEOUT_S" in unusable else "BLOCKS_RDZV_ENDPOINT="
        ) in (" ".join(refused.output.split()))
        assert read_summary(run_dir) == summary, "the last attempt's record stays"
        assert (run_dir / "config.yaml").read_text() == config, "nothing is written"
