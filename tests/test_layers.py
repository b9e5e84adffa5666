"""The import layers (pyproject's import-linter contracts) hold, and a back-edge breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_CLI = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", _CLI, str(root / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "blocks", root / "blocks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_layers_hold(tmp_path: Path) -> None:
    result = _lint_imports(_copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("package", "line", "edge", "also_broken"),
    [
        ("spec", "import blocks.core.plan\n", "blocks.spec.back_edge -> blocks.core.plan", True),
        (
            "runtime",
            "from blocks.launch import run_dir\n",
            "blocks.runtime.back_edge -> blocks.launch.run_dir",
            False,
        ),
    ],
    ids=["spec-imports-the-plan", "runtime-imports-launch"],
)
def test_a_back_edge_fails(tmp_path: Path, package: str, line: str, edge: str, also_broken: bool) -> None:
    root = _copy_tree(tmp_path)
    (root / "blocks" / package / "back_edge.py").write_text(line)
    result = _lint_imports(root)
    assert result.returncode != 0
    assert edge in result.stdout
    if also_broken:  # an edge from the bottom layer up also closes a cycle between sub-packages
        assert "No import cycles between sub-packages BROKEN" in result.stdout


def test_the_spec_base_imports_no_kind_and_no_torch() -> None:
    code = (
        "import sys, blocks.spec.errors, blocks.spec.registry, blocks.spec.kinds\n"
        "kinds = [m for m in sys.modules if m.split('.')[:2][-1] in blocks.spec.kinds.KINDS]\n"
        "heavy = [m for m in ('torch', 'hydra', 'omegaconf', 'lightning', 'pytorch_lightning') if m in sys.modules]\n"
        "print(kinds, heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "[] []", out.stdout + out.stderr
