"""Helpers for tests that ``pip install`` real packages into a throwaway virtual environment."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO, Result

EXAMPLE = REPO / "examples" / "acme-tabular"

QUIET_LOCAL = ["--no-deps", "--no-build-isolation", "-q"]
"""pip flags for local projects: the host's hatchling builds them (an isolated build env costs ~5 s each)."""

VENV = ["--system-site-packages", "--without-pip"]
"""``python -m venv`` flags: the venv sees the host's packages, the host's pip among them.

``VENV/bin/python -m pip`` runs the host's pip and installs into the venv. A venv's own copy of
pip (``ensurepip``) took 5-12 s to install, once per venv.
"""


@dataclass
class Venv:
    """A virtual environment that sees the host's packages and runs this checkout's ``blocks``."""

    root: Path

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        # PYTHONPATH puts this worktree's blocks ahead of any installed copy, in workers too.
        return {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "200",
            **(extra or {}),
        }

    def pip_install(self, *targets: Path | str) -> None:
        """Install *targets* (wheels or project directories) without dependencies or a build venv."""
        subprocess.run(
            [self.python, "-m", "pip", "install", *QUIET_LOCAL, *map(str, targets)],
            check=True,
            env=self.env(),
        )

    def run(self, *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None) -> Result:
        proc = subprocess.run(
            [self.python, *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(env),
            stdin=subprocess.DEVNULL,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def blocks(
        self, *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
    ) -> Result:
        return self.run("-m", "blocks", *args, cwd=cwd, timeout=timeout, env=env)


def build_wheel(directory: Path) -> Path:
    """This checkout built into a wheel in *directory*, the way ``pip install .`` builds it."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *QUIET_LOCAL, "-w", str(directory), str(REPO)], check=True
    )
    (wheel,) = directory.glob("blocks-*.whl")
    return wheel


def make_venv(root: Path) -> Venv:
    """A fresh ``--system-site-packages`` venv under *root*: see :data:`VENV`."""
    subprocess.run([sys.executable, "-m", "venv", *VENV, str(root)], check=True)
    return Venv(root)


def write_package(root: Path, dist: str, namespace: str, module: str, source: str) -> Path:
    """A minimal block package: one module, one entry point ``namespace = module``."""
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(source)
    (root / "pyproject.toml").write_text(
        f"""[build-system]
requires = ["hatchling>=1.24"]
build-backend = "hatchling.build"

[project]
name = "{dist}"
version = "0.3.1"

[project.entry-points."blocks"]
{namespace} = "{module}"

[tool.hatch.build.targets.wheel]
packages = ["{module}"]
"""
    )
    return root
