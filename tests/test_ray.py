"""Jobs on a Ray cluster (trainer.launcher=ray) and sweeps on Ray (hydra/launcher=ray).

One local Ray cluster per module: a head and a second node on loopback, started with
``ray start --block`` in a process group of their own (killed at teardown, never ``ray stop``,
which would stop every Ray instance on the machine), with free ports and a short temp dir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blocks.checkpoint import store
from blocks.core import jobs
from blocks.launch.ray_workers import placement_problems
from tests.conftest import DDP_BLOBS, REPO, free_port, job_pids, read_summary, run_cli, spawned

pytestmark = pytest.mark.timeout(600)

RAY_CLI = shutil.which("ray") or "ray"
LONG_DDP = [
    "recipe=blobs",
    "data.samples=200000",
    "trainer.max_steps=400",
    "trainer.val_every=null",
    "strategy=ddp",
    "trainer.devices=2",
    "trainer.launcher=ray",
    "checkpoint.every_n_steps=5",
    "monitor.progress=off",
]


def _ray_node(args: list[str], env: dict[str, str]) -> contextlib.AbstractContextManager[subprocess.Popen]:
    ports = [
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        "--min-worker-port=0",  # Ray's worker processes: any free port
        "--max-worker-port=0",
    ]
    command = [
        RAY_CLI,
        "start",
        "--block",
        "--node-ip-address=127.0.0.1",
        "--disable-usage-stats",
        *ports,
        *args,
    ]
    return spawned(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for_nodes(address: str, count: int, deadline: float) -> int:
    """How many nodes of the cluster at *address* are alive, once *count* are or at *deadline* (``time.monotonic``).

    One process connects and polls: each connection costs a Python start and Ray's import.
    """
    script = (
        "import sys, time, ray\n"
        "address, count, wait_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])\n"
        "ray.init(address=address, logging_level='error')\n"
        "deadline = time.monotonic() + wait_s\n"
        "def alive(): return sum(1 for n in ray.nodes() if n['Alive'])\n"
        "while alive() < count and time.monotonic() < deadline:\n"
        "    time.sleep(0.2)\n"
        "print(alive())\n"
    )
    wait_s = max(deadline - time.monotonic(), 0.0)
    out = subprocess.run(
        [sys.executable, "-c", script, address, str(count), str(wait_s)],
        capture_output=True,
        text=True,
        timeout=wait_s + 120,
    )
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A two-node Ray cluster on loopback (head: 4 CPUs, second node: 2 CPUs); yields its address."""
    temp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    address = f"127.0.0.1:{port}"
    # its workers may import the tests' own callbacks (tests.lightning_habits), as a job's driver may
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "BLOCKS_ALLOW_IMPORTS": "tests",
        "PYTHONPATH": str(REPO),
    }
    head = [
        "--head",
        f"--port={port}",
        "--num-cpus=4",
        f"--temp-dir={temp}",
        "--include-dashboard=false",
        f"--ray-client-server-port={free_port()}",
    ]
    with contextlib.ExitStack() as stack:
        stack.enter_context(_ray_node(head, env))
        deadline = time.monotonic() + 120
        while _wait_for_nodes(address, 1, deadline) < 1 and time.monotonic() < deadline:
            time.sleep(1)
        stack.enter_context(_ray_node([f"--address={address}", "--num-cpus=2"], env))
        assert _wait_for_nodes(address, 2, deadline) == 2, "the local Ray cluster did not start"
        yield address
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def on_ray(ray_address: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("RAY_ADDRESS", ray_address)
    return ray_address


def start_blocks_run(args: list[str], cwd: Path) -> contextlib.AbstractContextManager[subprocess.Popen]:
    return spawned(
        [sys.executable, "-m", "blocks", "run", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def wait_for_checkpoint(run_dir: Path, step: int, timeout_s: float = 300) -> int:
    """Wait until a checkpoint at *step* or later is committed; returns the newest committed step."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            committed, _ = store.scan(str(run_dir / "checkpoints"))
            steps = [c.manifest.step for c in committed]
            if steps and max(steps) >= step:
                return max(steps)
        time.sleep(0.1)  # a scan of a local dir: cheap next to the job's steps
    raise AssertionError(f"no checkpoint at step {step} in {run_dir}")


def kill_one_worker(run_dir: Path) -> None:
    workers = job_pids(run_dir, workers_only=True)
    assert len(workers) == 2, workers
    os.kill(max(workers), signal.SIGKILL)


# --- without a cluster -------------------------------------------------------------------------


def test_the_launcher_key_is_checked_with_a_did_you_mean(cli) -> None:
    result = cli("plan", "trainer.launcher=rey")
    assert result.returncode == 2
    assert "trainer.launcher" in result.output and "ray" in result.output


def test_planning_a_ray_job_imports_neither_ray_nor_torch() -> None:
    script = (
        "import sys; from blocks.core import jobs; "
        "jobs.plan(['recipe=blobs', 'trainer.launcher=ray', 'strategy=ddp', 'trainer.devices=2']); "
        "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_placement_needs_as_many_fitting_nodes_as_trainer_nodes() -> None:
    plan = jobs.plan(["recipe=blobs", "trainer.launcher=ray", "trainer.nodes=2", "data.num_workers=1"])
    assert placement_problems(plan, [{"CPU": 4.0}, {"CPU": 2.0}]) == []
    (problem,) = placement_problems(plan, [{"CPU": 8.0}, {"CPU": 1.0}])
    assert problem.key == "trainer.nodes" and problem.check == "ray-placement"
    assert "CPU=2" in problem.message  # a worker's CPU and its data loader process
    gpu = jobs.plan(["recipe=blobs", "trainer.launcher=ray", "trainer.accelerator=gpu", "trainer.devices=2"])
    (problem,) = placement_problems(gpu, [{"CPU": 8.0, "GPU": 1.0}])
    assert problem.key == "trainer.devices" and "GPU=2" in problem.message


def test_the_ray_sweep_launcher_passes_the_import_seam() -> None:
    composed = jobs.compose(["recipe=blobs", "hydra/launcher=ray"])
    assert composed is not None


@pytest.mark.slow
@pytest.mark.xdist_group(
    "torchrun"
)  # with test_faults_processes' DDP SIGTERM test, which shares ddp_blobs_run
def test_without_ray_address_a_local_ray_instance_runs_the_job_as_torchrun_does(
    ddp_blobs_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``RAY_ADDRESS`` the job starts a local Ray instance; it writes the same run dir and
    weights as the job under torchrun (:func:`ddp_blobs_run`), and leaves no process behind. (The
    jobs below connect to the module's cluster through ``RAY_ADDRESS``; the launcher runs the same
    code on either.)"""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run_dir = tmp_path / "ray"
    args = ["run", *DDP_BLOBS, "monitor.progress=off", "trainer.launcher=ray", f"hydra.run.dir={run_dir}"]
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["restarts"] == 0
    assert summary["state_digest"] == read_summary(ddp_blobs_run)["state_digest"]
    files = {p.name for p in ddp_blobs_run.iterdir()}
    assert files <= {p.name for p in run_dir.iterdir()}
    assert job_pids(run_dir) == []


# --- on the module's Ray cluster ---------------------------------------------------------------


@pytest.mark.slow
def test_a_job_the_cluster_cannot_place_is_refused_before_anything_is_written(
    on_ray: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = [
        "recipe=blobs",
        "strategy=ddp",
        "trainer.nodes=3",
        "trainer.launcher=ray",
        f"hydra.run.dir={run_dir}",
    ]
    result = run_cli(["run", *args], cwd=tmp_path)
    assert result.returncode == 2, result.output[-3000:]
    assert "trainer.nodes" in result.output and "cannot place" in result.output
    assert "Traceback" not in result.output
    assert not (run_dir / "config.yaml").exists()


@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_the_job_resumes_from_its_last_checkpoint(
    on_ray: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt's rank 0 stalls after step 11 (``BLOCKS_FAULT_STALL``, first attempt only; the
    watchdog armed for it never fires), so the kill always lands on a running job however loaded the
    machine, and the restarted attempt trains 20 steps, not 400 (and a checkpoint every 5 steps)."""
    monkeypatch.setenv("BLOCKS_FAULT_STALL", "0:11:600")  # read by the workers
    run_dir = tmp_path / "run"
    max_steps = 20
    args = [a for a in LONG_DDP if not a.startswith("trainer.max_steps=")]
    args += [f"trainer.max_steps={max_steps}", "monitor.stall_timeout_s=600", "trainer.max_failures=1"]
    with start_blocks_run([*args, f"hydra.run.dir={run_dir}"], tmp_path) as proc:
        committed_before_kill = wait_for_checkpoint(run_dir, 10)
        kill_one_worker(run_dir)
        out, _ = proc.communicate(timeout=400)
        assert proc.returncode == 0, out[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["global_step"] == max_steps
    assert summary["restarts"] == 1
    resumed = Path(summary["resumed_from"]).name
    resumed_step = int(resumed.rsplit("-", 1)[1])
    assert resumed == store.step_dir_name(resumed_step)
    assert (
        committed_before_kill <= resumed_step < max_steps
    )  # the last checkpoint committed before the kill, or later
    assert "restart 1 of 1" in out


@pytest.mark.slow
def test_a_killed_worker_without_restarts_fails_the_job_naming_the_rank(on_ray: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with start_blocks_run([*LONG_DDP, f"hydra.run.dir={run_dir}"], tmp_path) as proc:
        wait_for_checkpoint(run_dir, 5)
        kill_one_worker(run_dir)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 1, out[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "failed"
    assert "died (SIGKILL)" in summary["reason"]
    assert summary["global_step"] >= 5
    assert wait_gone(run_dir) == []


def wait_gone(run_dir: Path, patience_s: float = 60) -> list[int]:
    deadline = time.monotonic() + patience_s
    while job_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    return job_pids(run_dir)


@pytest.mark.slow
def test_sigterm_to_a_ray_job_saves_and_exits_130(on_ray: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with start_blocks_run([*LONG_DDP, f"hydra.run.dir={run_dir}"], tmp_path) as proc:
        wait_for_checkpoint(run_dir, 5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 130, out[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted" and "SIGTERM" in summary["reason"]
    committed, _ = store.scan(str(run_dir / "checkpoints"))
    assert committed[-1].manifest.step == summary["global_step"]
    assert wait_gone(run_dir) == []


@pytest.mark.slow
def test_a_rank_that_cannot_stop_is_killed_after_the_shutdown_grace(on_ray: str, tmp_path: Path) -> None:
    """As torchrun does (``--shutdown-timeout``): a worker still running ``trainer.shutdown_grace_s``
    after the SIGTERM the driver passed on is killed, and the job ends as interrupted. A stopped
    rank can neither save nor end itself; without the backstop the driver waited forever."""
    run_dir = tmp_path / "run"
    args = [*LONG_DDP, "trainer.shutdown_grace_s=1", f"hydra.run.dir={run_dir}"]
    with start_blocks_run(args, tmp_path) as proc:
        wait_for_checkpoint(run_dir, 5)
        wedged = max(job_pids(run_dir, workers_only=True))
        os.kill(wedged, signal.SIGSTOP)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, out[-3000:]
    assert "still running 1s after SIGTERM (trainer.shutdown_grace_s=1)" in out, out[-3000:]
    assert read_summary(run_dir)["status"] == "interrupted"
    assert wait_gone(run_dir) == []


@pytest.mark.slow
def test_a_job_driver_in_a_ray_task_takes_the_sigint_a_not_forced_cancel_sends(
    on_ray: str, tmp_path: Path
) -> None:
    """The sweep's driver stops a job with ``ray.cancel(force=False)``, which runs the task's SIGINT
    handler: a job on Ray workers then passes SIGTERM to them, as on a signal to ``blocks run``
    (it took a KeyboardInterrupt, and its workers were killed unsaved)."""
    script = (
        "import os, sys, time, ray\n"
        "from blocks.launch.ray_workers import IN_RAY_TASK_ENV, Signals\n"
        "ray.init(address=sys.argv[1], logging_level='error')\n"
        "@ray.remote(max_retries=0)\n"
        "def job(flag):\n"
        "    os.environ[IN_RAY_TASK_ENV] = '1'\n"
        "    signals = Signals()\n"
        "    signals.install()\n"
        "    open(flag, 'w').close()\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not signals.received and time.monotonic() < deadline:\n"
        "        time.sleep(0.1)\n"
        "    signals.restore()\n"
        "    return signals.received\n"
        "flag = sys.argv[2]\n"
        "ref = job.remote(flag)\n"
        "while not os.path.exists(flag):\n"
        "    time.sleep(0.1)\n"
        "ray.cancel(ref, force=False, recursive=False)\n"
        "try:\n"
        "    print(ray.get(ref))\n"
        "except ray.exceptions.RayError as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, on_ray, str(tmp_path / "installed")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == f"[{int(signal.SIGINT)}]", out.stdout[-2000:]


@pytest.mark.slow
def test_a_sweep_of_two_jobs_on_two_ray_nodes_each_shares_one_ray_cluster(
    on_ray: str, tmp_path: Path
) -> None:
    """Each job runs a worker on each of the cluster's two nodes (trainer.nodes=2); both jobs at once."""
    sweep = tmp_path / "sweep"
    args = [
        "run",
        "-m",
        "recipe=blobs",
        "trainer.max_steps=6",
        "strategy=ddp",
        "trainer.nodes=2",
        "trainer.devices=1",
        "monitor.progress=off",
        "trainer.launcher=ray",
        "hydra/launcher=ray",
        "trainer.seed=1,2",
        f"hydra.sweep.dir={sweep}",
    ]
    result = run_cli(args, cwd=tmp_path, timeout=500)
    assert result.returncode == 0, result.output[-3000:]
    runs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert runs == ["0", "1"]
    summaries = [read_summary(sweep / run) for run in runs]
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert all(s["world_size"] == 2 for s in summaries)
    assert summaries[0]["state_digest"] != summaries[1]["state_digest"]  # two seeds, two jobs


@pytest.mark.slow
def test_ctrl_c_while_a_ray_sweep_connects_stops_it_with_130_and_no_traceback(
    on_ray: str, tmp_path: Path
) -> None:
    """A SIGINT that lands while ``ray.init`` runs (it raised a KeyboardInterrupt traceback, exit 1):
    recorded like one later in the sweep, it stops the sweep before any job with 130."""
    script = (
        "import os, signal, sys, ray\n"
        "from blocks.cli.main import main\n"
        "connect = ray.init\n"
        "def interrupted_init(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return connect(*args, **kwargs)\n"
        "ray.init = interrupted_init\n"
        "main(sys.argv[1:])\n"
    )
    sweep = tmp_path / "sweep"
    args = ["run", "-m", "recipe=blobs", "trainer.max_steps=2", "trainer.seed=1,2", "hydra/launcher=ray"]
    out = subprocess.run(
        [sys.executable, "-c", script, *args, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 130, out.stderr[-3000:]
    assert "SIGINT received while Ray started; the sweep stops" in out.stderr
    assert "Traceback" not in out.stderr
    assert not list(sweep.glob("*/summary.json")), "no job started"


@pytest.mark.slow
def test_a_sweep_job_whose_ray_task_dies_fails_alone_and_an_interrupted_one_stops_the_sweep(
    on_ray: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that kills its own Ray worker (SIGKILL: no handler runs) gets a ``failed`` summary
    naming the crash while the others run on; a job a SIGTERM stopped (its driver exits 130, which
    ends its task as a crash would) stops the sweep with 130, as under the basic launcher.

    Run again (that job alone), the sweep resumes it; Ctrl-C to the sweep's driver then stops it as a
    signal stops one job: it saves a checkpoint and says ``interrupted``, and the driver exits
    130 without a traceback (it ended with a KeyboardInterrupt, the job killed unsaved)."""
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    sweep = tmp_path / "sweep"
    callbacks = (
        "trainer.callbacks=[{_target_: tests.lightning_habits.KillOwnProcess, max_steps: 3},"
        " {_target_: tests.lightning_habits.SignalAtStep, step: 3}]"
    )
    args = ["-m", "recipe=blobs", "monitor.progress=off", callbacks, "data.samples=200000"]
    args += ["checkpoint.every_n_steps=5", "hydra/launcher=ray", f"hydra.sweep.dir={sweep}"]
    result = run_cli(["run", *args, "trainer.max_steps=2,3,100000"], cwd=tmp_path, timeout=300)
    assert result.returncode == 130, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    assert read_summary(sweep / "0")["status"] == "completed"
    crashed = read_summary(sweep / "1")
    assert crashed["status"] == "failed" and "Ray task died" in crashed["reason"], crashed
    assert read_summary(sweep / "2")["status"] == "interrupted"
    assert "job #2 was interrupted" in result.output and "the sweep stops" in result.output, result.output[
        -3000:
    ]
    with start_blocks_run([*args, "trainer.max_steps=100000", "hydra.sweep.subdir=2"], tmp_path) as proc:
        wait_for_checkpoint(sweep / "2", 5)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out and "SIGINT received" in out, out[-3000:]
    resumed = read_summary(sweep / "2")
    assert resumed["status"] == "interrupted" and resumed["resumed_from"], resumed
    committed, _ = store.scan(str(sweep / "2" / "checkpoints"))
    assert committed[-1].manifest.step == resumed["global_step"] > 3
    assert wait_gone(sweep / "2") == []
