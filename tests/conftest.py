"""Shared helpers: run the real ``blocks`` CLI in a subprocess and read run dirs."""

from __future__ import annotations

import contextlib
import faulthandler
import inspect
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.catalog_fixtures", "pytester"]

# One intra-op thread per process, in the test workers and every process they start: the suite
# runs a pytest-xdist worker per core, and most tests start more processes besides. With torch's
# default of a thread per core, each parallel op waits for its descheduled peer thread (an
# in-process training test took 166 s instead of 10 s beside two busy processes). Set
# OMP_NUM_THREADS to override.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parent.parent
TORCHRUN_SIGNS = ("devices=2", "check_ddp", "torchrun", "strategy=ddp", "strategy=fsdp", "nproc")
"""Text in a test (or its parameters) that means it starts several processes through torchrun."""


FAULT_DIR_ENV = "BLOCKS_TEST_FAULT_DIR"
"""Where each xdist worker's ``faulthandler`` writes, so a worker killed by a fatal signal leaves its stacks."""
_made_fault_dir: list[str] = []  # the directory, in the controller that made it
_fault_file: list[object] = []  # a worker's open file for faulthandler, kept alive
_made_mlflow_dir: list[str] = []  # the directory of the session's empty MLflow database, in the controller


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Send fatal-signal stacks of xdist workers to files the controller prints at the end.

    A worker's stderr is captured while a test runs, so when one dies of SIGABRT or SIGSEGV
    its ``faulthandler`` dump is lost with it; xdist only says "node down".
    """
    worker = getattr(config, "workerinput", None)
    if worker is None:
        if FAULT_DIR_ENV not in os.environ:
            os.environ[FAULT_DIR_ENV] = tempfile.mkdtemp(prefix="blocks-test-faults-")
            _made_fault_dir.append(os.environ[FAULT_DIR_ENV])
        if MLFLOW_EMPTY_DB_ENV not in os.environ:  # one for the session: workers and their subprocesses
            _made_mlflow_dir.append(tempfile.mkdtemp(prefix="blocks-test-mlflow-"))
            os.environ[MLFLOW_EMPTY_DB_ENV] = str(Path(_made_mlflow_dir[0]) / "empty.db")
        return
    directory = os.environ.get(FAULT_DIR_ENV)
    if directory:
        fh = open(Path(directory) / f"{worker['workerid']}.txt", "w")  # noqa: SIM115  # open for the process's life
        _fault_file.append(fh)
        faulthandler.enable(file=fh, all_threads=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the stacks of any worker that died of a fatal signal."""
    directory = os.environ.get(FAULT_DIR_ENV)
    if not directory or hasattr(terminalreporter.config, "workerinput"):
        return
    for path in sorted(Path(directory).glob("*.txt")):
        if path.stat().st_size:
            terminalreporter.section(f"{path.stem} died of a fatal signal: its threads' Python stacks")
            terminalreporter.write(path.read_text())


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller removes the workers' fault files once the summary is printed (and the empty MLflow database)."""
    for directory in _made_fault_dir:
        shutil.rmtree(directory, ignore_errors=True)
        os.environ.pop(FAULT_DIR_ENV, None)
    for directory in _made_mlflow_dir:
        shutil.rmtree(directory, ignore_errors=True)
        os.environ.pop(MLFLOW_EMPTY_DB_ENV, None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for ``pytest -n N --dist loadgroup`` (xdist reads them after this hook).

    A test that reads a module- or session-scoped fixture of a test module (a trained run dir)
    joins that module's group, so the fixture is built once, on one worker. A test that starts
    torchrun joins the ``torchrun`` group: two of them at once would ask a small machine for
    four or more busy processes and make step-timed tests flaky.
    """
    for item in items:
        if not isinstance(item, pytest.Function) or item.get_closest_marker("xdist_group"):
            continue
        shared = [
            name
            for name, defs in item._fixtureinfo.name2fixturedefs.items()
            if defs and defs[-1].scope in ("module", "session") and defs[-1].baseid.startswith("tests/")
        ]
        try:
            source = inspect.getsource(item.function)
        except (OSError, TypeError):  # a test made at run time has no source to read
            source = ""
        source += str(item.callspec.params) if hasattr(item, "callspec") else ""
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else shared[0]))
        elif any(sign in source for sign in TORCHRUN_SIGNS):
            item.add_marker(pytest.mark.xdist_group("torchrun"))


@dataclass
class Result:
    """A finished CLI invocation."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(
    args: Sequence[str], *, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> Result:
    """Run ``python -m blocks ARGS`` as a user would, without a terminal."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "blocks", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        stdin=subprocess.DEVNULL,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def run_in_process(args: Sequence[str], *, cwd: Path, apart: bool = False) -> Result:
    """``blocks ARGS`` in this process through the console script's own entry (``run_captured``).

    For commands where a process per call shows nothing more: the torch-free ones (``plan``,
    ``list``), refusals, and one-process runs, evaluations and exports (a run trains in this
    process; it gives back the cwd, environment and logging it found). stdout holds everything
    the command printed (stderr included), stderr is empty; with *apart*, each holds its own.
    """
    from blocks.cli.main import run_captured, run_captured_apart

    with contextlib.chdir(cwd):
        if apart:
            return Result(*run_captured_apart(list(args)))
        code, output = run_captured(list(args))
    return Result(code, output, "")


def call_in_fresh_process(function: Callable[..., Any], *args: Any, timeout: float = 300) -> Any:
    """``function(*args)`` in a new Python process (a test module's top-level function); its JSON result.

    For in-process work that leaves state behind which no API clears (a process group torch
    keeps alive): the pytest worker never hosts it.
    """
    script = (
        "import importlib, json, sys\n"
        "marker, module, name, args = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])\n"
        "sys.path += sys.argv[5:]\n"  # as pytest imports test modules: by directory
        "result = getattr(importlib.import_module(module), name)(*args)\n"
        "print('\\n' + marker + json.dumps(result))\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            _RESULT,
            function.__module__,
            function.__name__,
            json.dumps(args),
            str(Path(inspect.getfile(function)).parent),
            str(REPO),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith(_RESULT)]
    return json.loads(line.removeprefix(_RESULT))


_RESULT = "blocks-test-result: "


MLFLOW_EMPTY_DB_ENV = "BLOCKS_TEST_MLFLOW_EMPTY_DB"
"""An empty MLflow sqlite database (its schema made) that :func:`mlflow_logger` copies; inherited by subprocesses."""


def empty_mlflow_database(database: Path) -> None:
    """Make *database* (unless it exists) a copy of an empty MLflow sqlite database made once per session.

    MLflow makes a new database by running every schema migration, 3-8 s on a busy machine; a
    copy is the same empty database, the test's own. The first test to need it makes it where
    :data:`MLFLOW_EMPTY_DB_ENV` says (the pytest controller's, which removes it at the end).
    """
    if database.exists():
        return
    template = os.environ.get(MLFLOW_EMPTY_DB_ENV, "")
    if not template:  # not under this conftest's pytest: one for this process
        import atexit

        directory = tempfile.mkdtemp(prefix="blocks-test-mlflow-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        template = os.environ[MLFLOW_EMPTY_DB_ENV] = str(Path(directory) / "empty.db")
    if not Path(template).is_file():
        import mlflow

        made = (
            f"{template}.{os.getpid()}.{threading.get_ident()}"  # then renamed: a reader sees all or nothing
        )
        mlflow.MlflowClient(tracking_uri=f"sqlite:///{made}").search_experiments()
        os.replace(made, template)
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, database)


def mlflow_logger(database: Path, experiment: str) -> str:
    """The ``monitor.loggers`` override of ``metrics.csv`` and an MLflow logger tracking into the sqlite *database*.

    A new *database* starts as a copy of an empty one (:func:`empty_mlflow_database`).
    """
    empty_mlflow_database(database)
    return (
        "monitor.loggers=[csv,{_target_: pytorch_lightning.loggers.MLFlowLogger,"
        f" tracking_uri: 'sqlite:///{database}', experiment_name: {experiment}}}]"
    )


def mlflow_statuses(database: Path, experiment: str) -> list[str]:
    """The status of every MLflow run of *experiment* in the sqlite *database* (FINISHED, FAILED, KILLED...)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{database}")
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else [run.info.status for run in client.search_runs([found.experiment_id])]


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


FSDP_LM = [
    "recipe=tiny_lm",
    "trainer.val_every=null",
    "strategy=fsdp",
    "trainer.devices=2",
    "data.batch_size=8",
    "checkpoint.every_n_steps=4",
    "monitor.progress=off",
]
"""tiny_lm under FSDP on two processes with a sharded checkpoint every 4 steps (the FSDP checkpoint tests)."""


@pytest.fixture(scope="session")
def fsdp_sync_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run dir of :data:`FSDP_LM` trained 8 steps with synchronous saves (checkpoints at steps 4 and 8).

    Shared by the FSDP async-save and save/resume/reshard tests, test_security's honest
    sharded checkpoint and test_faults_processes' SIGTERM'd FSDP job (whose rerun must reach
    its digest), all in the ``torchrun`` group (so on one pytest-xdist worker): read it, copy
    what a test would change.
    """
    run_dir = tmp_path_factory.mktemp("fsdp-sync") / "run"
    result = run_in_process(
        ["run", *FSDP_LM, "trainer.max_steps=8", f"hydra.run.dir={run_dir}"], cwd=run_dir.parent
    )
    assert result.returncode == 0, result.output[-3000:]
    return run_dir


@pytest.fixture(scope="session")
def fsdp_resumed_on_two(fsdp_sync_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """:func:`fsdp_sync_run`'s checkpoints copied to a checkpoint dir, and FSDP_LM resumed there on two processes.

    The run (``"run"``) resumes the copy's step 8 and trains to step 12, saving a sharded
    checkpoint at 12 into that dir (``"checkpoints"``). Read by the FSDP save/resume/reshard
    test, which goes on from step 12 on one process in a copy, and by test_security's
    honest-checkpoint test (the honest sharded checkpoint loads on resume); both in the
    ``torchrun`` group.
    """
    root = tmp_path_factory.mktemp("fsdp-resumed")
    checkpoints, run_dir = root / "checkpoints", root / "run"
    shutil.copytree(fsdp_sync_run / "checkpoints", checkpoints)
    args = [
        "run",
        *FSDP_LM,
        f"checkpoint.dir={checkpoints}",
        "trainer.max_steps=12",
        f"hydra.run.dir={run_dir}",
    ]
    result = run_in_process(args, cwd=root)
    assert result.returncode == 0, result.output[-3000:]
    return {"run": run_dir, "checkpoints": checkpoints}


DDP_BLOBS = [
    "recipe=blobs",
    "data.samples=100000",
    "strategy=ddp",
    "trainer.devices=2",
    "trainer.max_steps=30",
    "trainer.val_every=null",
    "monitor.log_every_n_steps=1",
    "monitor.stall_timeout_s=120",
    "monitor.loggers=[csv,tensorboard]",
]
"""blobs under DDP on two processes for 30 steps, every step logged (TensorBoard too), the stall watchdog armed
(the DDP SIGTERM test)."""


@pytest.fixture(scope="session")
def ddp_blobs_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run dir of :data:`DDP_BLOBS` trained uninterrupted under torchrun (``monitor.progress=off``).

    Its digest is what test_faults_processes' SIGTERM'd DDP job reaches when rerun, and what
    test_ray's job on a local Ray instance reaches; both in the ``torchrun`` group (so on one
    pytest-xdist worker): read it, copy what a test would change.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from blocks.launch.driver import run

    run_dir = tmp_path_factory.mktemp("ddp-blobs") / "run"
    summary = run([*DDP_BLOBS, "monitor.progress=off"], run_dir)
    # Regression: every rank wrote TensorBoard's HParams, and rank 1 (no file writer) failed the job.
    assert summary.status == "completed" and summary.state_digest, summary
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 31))
    assert (run_dir / "tensorboard" / "hparams.yaml").is_file()
    assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")
    return run_dir


@pytest.fixture
def cli(tmp_path: Path):
    """``cli(*args)`` runs the CLI in a fresh directory."""

    def invoke(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> Result:
        return run_cli(args, cwd=tmp_path, timeout=timeout, env=env)

    return invoke


@pytest.fixture
def cli_in_process(tmp_path: Path):
    """``cli_in_process(*args)``: :func:`run_in_process` in a fresh directory."""

    def invoke(*args: str, apart: bool = False) -> Result:
        return run_in_process(args, cwd=tmp_path, apart=apart)

    return invoke


@contextlib.contextmanager
def spawned(
    args: Sequence[str], popen: type[subprocess.Popen] = subprocess.Popen, **kwargs
) -> Iterator[subprocess.Popen]:
    """A process in its own session; it and everything it started are killed when the block exits."""
    proc = popen(list(args), start_new_session=True, **kwargs)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


class DrainedPopen(subprocess.Popen):
    """A text-mode ``Popen`` whose output a thread keeps reading once :meth:`keep_reading` is called.

    A job whose output nobody reads stalls once the pipe is full (64 KiB), and after a kill -9
    multiprocessing's resource tracker, writing its warnings about the dead workers'
    semaphores into that pipe, would never exit. :meth:`communicate` returns what was read.
    """

    _reader: threading.Thread | None = None

    def keep_reading(self) -> None:
        """Read the rest of the output on a thread from now on."""
        assert self.stdout is not None
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._lines.extend, args=(self.stdout,), daemon=True)
        self._reader.start()

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Wait for the process; its output since :meth:`keep_reading` (all of it if never called)."""
        if self._reader is None:
            return super().communicate(input, timeout)
        self.wait(timeout)
        self._reader.join(timeout)
        return "".join(self._lines), None


@contextlib.contextmanager
def blocks_run_until_step(
    args: Sequence[str], *, cwd: Path, step: int, timeout: float = 240
) -> Iterator[subprocess.Popen]:
    """Start ``blocks run ARGS`` and yield once its progress reaches optimizer step *step*.

    From then on a thread reads the output (``proc.communicate()`` returns the rest), so the
    job never waits on a full pipe. The process (and every worker it started) is killed when
    the block exits.
    """
    command = [sys.executable, "-m", "blocks", "run", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with spawned(
        command,
        popen=DrainedPopen,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    ) as proc:
        assert isinstance(proc, DrainedPopen) and proc.stdout is not None
        deadline = time.monotonic() + timeout
        for line in proc.stdout:
            if line.startswith(f"step {step}/") or time.monotonic() > deadline:
                break
        proc.keep_reading()
        yield proc


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def moto_s3_server() -> Iterator[dict[str, str]]:
    """moto's standalone S3 server on a free loopback port; yields the environment that points s3fs at it.

    Subprocesses get the endpoint through the environment (fsspec reads ``FSSPEC_S3_*`` at
    import); set it in this process too (``fsspec.config.conf["s3"]``) where the test reads S3 itself.
    """
    port = free_port()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with spawned(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        yield env


@dataclass(frozen=True)
class ProcessStat:
    """What ``/proc/PID/stat`` says of a process: its name, state letter and parent."""

    name: bytes
    state: bytes
    parent: int


def process_stat(pid: int | str) -> ProcessStat | None:
    """``/proc/PID/stat`` of *pid*, None when the process is gone (a zombie is not gone: state ``Z``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold spaces and ")"
    return ProcessStat(
        name=stat[stat.index(b"(") + 1 : stat.rindex(b")")], state=fields[0], parent=int(fields[1])
    )


def parent_of(pid: int) -> int | None:
    """The parent process id of *pid*, None when it is gone."""
    stat = process_stat(pid)
    return None if stat is None else stat.parent


def describe_process(pid: int) -> str:
    """``PID NAME (STATE, parent PPID): COMMAND LINE``, for assertion messages about processes."""
    stat = process_stat(pid)
    if stat is None:
        return f"{pid} (gone)"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmdline = "?"
    return (
        f"{pid} {stat.name.decode(errors='replace')} ({stat.state.decode()}, parent {stat.parent}): {cmdline}"
    )


def alive(pids: list[int]) -> list[int]:
    """Those of *pids* that still run (neither gone nor zombies)."""
    return [pid for pid in pids if (stat := process_stat(pid)) is not None and stat.state != b"Z"]


def job_pids(run_dir: Path, *, workers_only: bool = False) -> list[int]:
    """Live processes of the job in *run_dir*: torchrun, its forkserver and the workers (or the workers only).

    Workers started by a command (Ray's actors, srun) name the run dir in their command line;
    torchrun's are forked from its forkserver, so they are found as its descendants and tell
    themselves apart by their process name.
    """
    processes: dict[int, tuple[int, bytes, bytes]] = {}  # pid: (parent pid, command line, name)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if (stat := process_stat(entry.name)) is not None and stat.state != b"Z":
            processes[int(entry.name)] = (stat.parent, cmdline, stat.name)
    job = {
        pid
        for pid, (_, cmdline, _) in processes.items()
        if str(run_dir).encode() in cmdline.split(b"\0") and b"blocks.launch.worker" in cmdline.split(b"\0")
    }
    while grown := {pid for pid, (parent, _, _) in processes.items() if parent in job} - job:
        job |= grown
    if workers_only:
        job = {pid for pid in job if _is_worker(*processes[pid][1:])}
    return sorted(job)


def _is_worker(cmdline: bytes, name: bytes) -> bool:
    """A worker forked by torchrun (named by its rank) or one started by a command (Ray, srun)."""
    from blocks.launch.lifeline import WORKER_NAME

    arguments = cmdline.split(b"\0")
    return name.startswith(WORKER_NAME.encode()) or (
        b"blocks.launch.worker" in arguments and b"blocks.launch.torchrun_main" not in arguments
    )
