"""Developer sessions: ``nox -s lint typecheck tests`` is what CI runs; ``docs`` builds the site."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.default_venv_backend = "venv"

# The CPU build on this project's machines; set BLOCKS_TORCH to e.g. "torch==2.13.0" from another index
# for a GPU build.
TORCH = os.environ.get("BLOCKS_TORCH", "torch==2.13.0")
PARALLEL = [
    "-n",
    os.environ.get("BLOCKS_TEST_WORKERS", "auto"),
    "--dist",
    "loadgroup",
    "--max-worker-restart=0",
]
"""pytest-xdist: a worker per core (``BLOCKS_TEST_WORKERS=3`` to choose), shared-fixture tests grouped.

A worker that dies ends the run with the test it died in named: xdist 3.8's ``loadgroup``
scheduler can wait forever for a replaced worker (pytest-xdist issues 1323, 1327, 1378).
"""


def install_project(session: nox.Session, extras: str = "dev") -> None:
    session.install(TORCH)
    session.install("-e", f".[{extras}]")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff lint and format check, and the import layers (lint-imports: a back-edge or a cycle fails)."""
    session.install("ruff==0.17.6", "import-linter==2.17")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports", env={"PYTHONPATH": str(Path(__file__).parent)})


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the library."""
    install_project(session)
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """The pytest suite (real processes, real training on CPU), on every core through pytest-xdist.

    Tests that share a module's trained run dir, or start torchrun, are kept on one worker
    (``--dist loadgroup``, groups set in tests/conftest.py). Arguments go to pytest:
    ``nox -s tests -- -m "not slow"`` for the edit loop, ``nox -s tests -- -n 0 tests/test_plan.py`` serial.
    Where the machine has Open MPI (``mpicc``), mpi4py is installed too so the mpirun test runs.
    """
    install_project(session)
    if shutil.which("mpicc"):
        session.install("-e", ".[mpi]")
    args = list(session.posargs)
    if not any(a.startswith(("-n", "--numprocesses", "--dist")) for a in args):
        args = [*PARALLEL, *args]
    session.run("pytest", *args)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site with warnings as errors."""
    install_project(session, "dev,docs")
    session.run("mkdocs", "build", "--strict", "-d", "site")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against plain Lightning and plain PyTorch; ``nox -s bench -- --only overhead`` for one suite.

    Without arguments runs ``--quick`` (a few minutes); results go to ``benchmarks/results/``.
    """
    install_project(session)
    session.run("python", "-m", "benchmarks", *(session.posargs or ["--quick"]))
