"""``python -m blocks ARGS`` in a process forked from an interpreter that already imported torch and Lightning.

Every process that trains spends about 6 s of CPU importing torch and Lightning before it
reads its first argument; a suite that starts a few dozen of them on a 2-core machine spends
minutes on nothing else. Each pytest worker therefore keeps one multiprocessing forkserver that
has imported the third-party libraries (never blocks: each call imports the code under test
afresh) and forks a process per call, as torchrun's forkserver does for blocks' workers.

The child is set up as a fresh ``python -m blocks`` would be: the caller's arguments, working
directory and environment, ``sys.path`` as a fresh interpreter in that directory would have it,
standard input from ``/dev/null``, unbuffered output into files the caller reads back, and the
interpreter's exit sequence (non-daemon threads joined, then ``atexit``). What it cannot be is
an interpreter start, so :func:`serves` refuses a command whose environment differs from the
one the server imported under (libraries read settings at import: fsspec its ``FSSPEC_*``
config, for one): those, and tests about start-up itself (what planning imports), start a
fresh interpreter.
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

PRELOAD = ["torch", "pytorch_lightning", "hydra", "omegaconf"]
"""What the server imports once: third-party libraries only, so blocks itself is imported per call."""


PER_CALL_VARIABLES = ("PYTHONUNBUFFERED", "COLUMNS", "PYTEST_CURRENT_TEST")
"""Environment variables that may differ between the server and a call: nothing reads them at import."""

_base_environment: list[dict[str, str]] = []  # the session's environment, before any test changed it
_started: list[bool] = []


def _comparable(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in PER_CALL_VARIABLES}


def remember_environment() -> None:
    """Record the session's environment; the server starts under it, at its first use."""
    if not _base_environment:
        _base_environment.append(_comparable(os.environ))


def serves(env: Mapping[str, str]) -> bool:
    """Whether a command with environment *env* can run preloaded (the server imports under the session's)."""
    if not _base_environment or _comparable(env) != _base_environment[0]:
        return False
    if not _started:
        if _comparable(os.environ) != _base_environment[0]:
            return False  # a test changed this process's environment: the server would inherit it
        multiprocessing.set_forkserver_preload(PRELOAD)
        multiprocessing.forkserver.ensure_running()
        _started.append(True)
    return True


@functools.cache
def _interpreter_path() -> tuple[str, ...]:
    """``sys.path`` of a fresh interpreter, without its first entry (the script's directory) or ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple(json.loads(out))


def run_blocks(
    args: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float
) -> tuple[int, str, str]:
    """``python -m blocks ARGS`` in *cwd* with exactly *env*: (exit status, stdout, stderr).

    Only for an *env* the server :func:`serves`. The status is negative when a signal ended the
    process, as :mod:`subprocess` reports it. Raises :class:`subprocess.TimeoutExpired` (after
    killing the process) past *timeout* seconds.
    """
    assert serves(env), "the preloaded interpreter imported under another environment"
    with tempfile.TemporaryDirectory(prefix="blocks-cli-") as outputs:
        out, err = Path(outputs, "stdout"), Path(outputs, "stderr")
        process = multiprocessing.get_context("forkserver").Process(
            target=_child,
            args=(list(args), str(cwd), dict(env), str(out), str(err), _interpreter_path()),
            name="blocks",
        )
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired([sys.executable, "-m", "blocks", *args], timeout)
        read = functools.partial(Path.read_text, encoding="utf-8", errors="replace")
        return process.exitcode, read(out), read(err)


def _child(
    args: list[str], cwd: str, env: dict[str, str], out: str, err: str, interpreter_path: tuple[str, ...]
) -> None:
    """The forked process: become ``python -m blocks ARGS`` and exit as that interpreter would."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [cwd, *extra, *interpreter_path]
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file, fd)
        os.close(file)
    sys.stdout, sys.stderr = (
        io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", write_through=True)
        for fd in (1, 2)
    )
    sys.argv = ["-m", *args]
    code = 0
    try:
        runpy.run_module("blocks", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            stream.flush()
    os._exit(code)
