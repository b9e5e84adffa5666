"""Library code leaves the process alone: it returns exit statuses and raises; only entry points end the process."""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import pytest

import blocks
from blocks.cli.main import run_captured
from blocks.launch import driver
from blocks.launch.lifeline import PARENT_ENV, die_with_parent
from blocks.launch.worker import run_worker
from tests.conftest import REPO

PACKAGE = Path(blocks.__file__).parent
TINY = ["recipe=blobs", "data.samples=256", "trainer.max_steps=2", "monitor.progress=off"]


def test_blocks_run_hands_its_own_arguments_to_hydra_without_rewriting_sys_argv() -> None:
    before = list(sys.argv)
    code, out = run_captured(["run", "--cfg", "job", *TINY])
    assert code == 0, out
    assert "max_steps: 2" in out
    assert sys.argv == before


def test_a_worker_returns_its_exit_status_for_a_config_mistake(tmp_path: Path) -> None:
    """A run dir whose checkpoint directory holds only damaged checkpoints: the worker says so and returns 2."""
    driver.prepare([*TINY, "checkpoint.resume=auto"], tmp_path)
    damaged = tmp_path / "checkpoints" / "step-000000001"
    damaged.mkdir(parents=True)
    (damaged / "MANIFEST.json").write_text("{not json")
    assert run_worker(tmp_path) == 2
    assert "none is usable" in (tmp_path / "summary.json").read_text()


def test_die_with_parent_only_reports_an_orphan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PARENT_ENV, raising=False)
    assert die_with_parent() is True


def exits_in(path: Path) -> list[str]:
    """Calls of ``sys.exit``/``os._exit``/``exit`` in *path*, as ``function:line``."""
    found = []
    tree = ast.parse(path.read_text())
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "os._exit", "exit"):
                found.append(f"{function.name}:{node.lineno}")
    return found


def test_only_process_entry_points_end_the_process() -> None:
    """``main`` of the CLI, the worker and the torchrun wrapper, the forked worker; the stall watchdog's and the shutdown
    grace's threads, and a data loader worker's SIGTERM thread (its loader ending it, as torch's own handler does)."""
    allowed = {
        "cli/main.py": {"main", "_exit_at_once"},
        "launch/worker.py": {"main", "forked_worker"},
        "launch/torchrun.py": {"main"},
        "runtime/health.py": {"_record_and_exit"},
        "runtime/preemption.py": {"_end_overdue"},
        "runtime/datamodule.py": {"_end_on_sigterm_from_parent", "_end_on_handled_sigterm_once_done"},
    }
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for call in exits_in(path):
            if call.split(":")[0] not in allowed.get(where, set()):
                offenders.append(f"{where}:{call}")
    assert offenders == []


def test_composing_leaves_an_initialized_hydra_as_it_was(tmp_path: Path) -> None:
    """A compose inside a running Hydra app (a pipeline stage, a sweep job) does not reset that app's Hydra."""
    from hydra import compose, initialize_config_dir

    from blocks.core import jobs

    (tmp_path / "app.yaml").write_text("x: 1\n")
    with initialize_config_dir(version_base="1.3", config_dir=str(tmp_path), job_name="outer"):
        jobs.compose(TINY)
        assert compose("app").x == 1


def test_a_one_process_ddp_run_leaves_the_environment_as_it_found_it(tmp_path: Path) -> None:
    """Regression: Lightning's MASTER_ADDR/MASTER_PORT and seed variables stayed in os.environ after the run."""
    import os

    names = ("MASTER_ADDR", "MASTER_PORT", "PL_GLOBAL_SEED", "PL_SEED_WORKERS")
    before = {name: os.environ.get(name) for name in names}
    summary = driver.run([*TINY, "strategy=ddp", "trainer.devices=1"], tmp_path)
    assert summary.status == "completed" and summary.world_size == 1
    assert {name: os.environ.get(name) for name in names} == before


def test_blocks_run_in_process_gives_back_the_callers_logging(tmp_path: Path) -> None:
    """Regression: Hydra's job logging left the root logger writing to the last run's blocks.log, at its level."""
    import logging

    root = logging.getLogger()
    ours = logging.StreamHandler()
    root.addHandler(ours)
    before = (list(root.handlers), root.level)
    try:
        code, out = run_captured(["run", *TINY, f"hydra.run.dir={tmp_path / 'run'}"])
        assert code == 0, out
        assert (tmp_path / "run" / "blocks.log").is_file(), "the run still logs to its run dir"
        assert (list(root.handlers), root.level) == before
        logging.getLogger("after.the.run").warning("a later record")
        assert "a later record" not in (tmp_path / "run" / "blocks.log").read_text()
    finally:
        root.removeHandler(ours)


CUDA_QUERIES = (
    "is_available",
    "device_count",
    "init",
    "_lazy_init",
    "current_device",
    "get_device_properties",
)

PRELOAD_PROBE = f"""
import torch.cuda
queried = []
for name in {CUDA_QUERIES!r}:
    setattr(torch.cuda, name, lambda *a, _name=name, **k: queried.append(_name))
import gc
import blocks.launch.forkserver
print(queried, gc.get_freeze_count() > 0)
"""


def test_the_forkservers_preload_never_touches_cuda_and_freezes_what_it_imported() -> None:
    """torchrun forks GPU workers from the preloaded server: CUDA queried there would fail them all.

    (Querying CUDA arms torch's check that a forked child cannot use it.) The imported objects are
    frozen, so the workers' garbage collections leave them alone.
    """
    import subprocess

    probe = subprocess.run(
        [sys.executable, "-c", PRELOAD_PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    assert probe.stdout.strip() == "[] True", probe.stdout + probe.stderr


EXIT_PROBE = """
import atexit, gc, sys
walked_torch = []  # collections that walked the objects torch's import made: it ran, nothing was frozen
gc.callbacks.append(
    lambda phase, info: phase == "start"
    and "torch" in sys.modules
    and gc.get_freeze_count() == 0
    and walked_torch.append(info["generation"])
)
atexit.register(lambda: print("collections over torch:", walked_torch, "frozen at exit:", gc.get_freeze_count() > 0))
from blocks.cli.main import main
main()
"""


def test_the_blocks_command_spares_the_collector_its_imports_and_exit_and_an_in_process_run_leaves_it_alone(
    tmp_path: Path,
) -> None:
    """The console script pauses the collector while torch and Lightning import, freezes what they
    made, and ends without Python's last collections, which would walk those objects (about a
    second each way). Called in another program, it leaves that program's collector as it found it.

    The run carries a callback from a module that imports Lightning itself: the preflight imports
    it before training does (it imported Lightning with the collector running: seven collections).
    """
    import gc
    import subprocess

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    before = gc.get_freeze_count()
    code, out = run_captured(["run", *TINY, f"hydra.run.dir={tmp_path / 'in-process'}"])
    assert code == 0, out
    assert gc.get_freeze_count() == before and gc.isenabled()

    run_dir = tmp_path / "run"
    steps = tmp_path / "steps.json"
    logged = ["monitor.loggers=[csv,tensorboard]", "monitor.log_every_n_steps=1"]
    logged += [f"trainer.callbacks=[{{_target_: tests.lightning_habits.StepLog, path: '{steps}'}}]"]
    probe = subprocess.run(
        [sys.executable, "-c", EXIT_PROBE, "run", *TINY, *logged, f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BLOCKS_ALLOW_IMPORTS": "tests", "PYTHONPATH": str(REPO)},
    )
    assert probe.returncode == 0, probe.stdout[-2000:] + probe.stderr[-2000:]
    last_line = probe.stdout.strip().splitlines()[-1]
    assert last_line == "collections over torch: [] frozen at exit: True", probe.stdout[-2000:]
    # what the run wrote as it ended is all there
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert (run_dir / "metrics.csv").read_text().splitlines()[-1].startswith("2,")
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2]
    assert json.loads(steps.read_text())["steps"] == [1, 2]


def test_a_sweeps_check_imports_its_jobs_import_paths_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before a sweep starts, every job's import paths are imported and checked (a callback's module
    may import torch and Lightning: collections there walk their objects for nothing). The second
    job is refused, so nothing trains."""
    import gc

    monkeypatch.delitem(sys.modules, "tests.imported_with_collector", raising=False)
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    callback = "trainer.callbacks=[{_target_: tests.imported_with_collector.Noop}]"
    tiny = [a for a in TINY if not a.startswith("trainer.max_steps=")]
    code, out = run_captured(["run", "-m", *tiny, callback, "trainer.max_steps=2,-1"])
    assert (
        code == 2 and "no job of the sweep was started" in out and "trainer.max_steps: must be > 0" in out
    ), out
    assert sys.modules["tests.imported_with_collector"].COLLECTOR_ENABLED_AT_IMPORT is False
    assert gc.isenabled()


SWEEP_PROBE = """
import gc, weakref
from blocks.launch.collector import collection_paused, own_this_process

class Job:
    pass

own_this_process()
with collection_paused():
    import xml.dom.minidom  # the first job's imports: frozen
first = gc.get_freeze_count()
earlier = Job()
earlier.cycle = earlier  # what an earlier job leaves for the collector
left = weakref.ref(earlier)
del earlier
with collection_paused():
    import xml.dom.minidom  # a later job's imports: nothing new
gc.collect()
print(first > 0, gc.get_freeze_count() == first, left() is None)
"""


def test_a_later_jobs_imports_freeze_nothing_so_what_earlier_jobs_left_is_still_collected() -> None:
    """A sweep runs its jobs in one process: only the first job's imports are frozen. Freezing again
    would keep each finished job's trainer and model (reference cycles) for the rest of the sweep."""
    import subprocess

    probe = subprocess.run(
        [sys.executable, "-c", SWEEP_PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert probe.stdout.split() == ["True", "True", "True"], probe.stdout + probe.stderr


@pytest.mark.parametrize(("devices", "given", "expected"), [(2, None, "1"), (2, "3", "3"), (1, None, None)])
def test_torchrun_gives_each_of_several_local_workers_one_thread_unless_told(
    devices: int, given: str | None, expected: str | None
) -> None:
    """Set for torchrun before it starts: its forkserver imports torch before torchrun's own defaults apply."""
    from blocks.core import jobs
    from blocks.launch.torchrun import torchrun_environment

    plan = jobs.plan(["recipe=blobs", "strategy=ddp", f"trainer.devices={devices}"])
    environ = {"PATH": "/usr/bin"} | ({"OMP_NUM_THREADS": given} if given else {})
    assert torchrun_environment(plan, environ).get("OMP_NUM_THREADS") == expected
