"""A non-editable ``pip install .`` works from any directory, with recipes and presets inside the wheel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.packaging import QUIET_LOCAL, VENV, build_wheel

OUTSIDE_CHECKOUT = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
"""The environment of every venv command: a PYTHONPATH naming a checkout would import it instead of the wheel."""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with blocks installed from a freshly built wheel (deps from the host)."""
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(root)
    names = zipfile.ZipFile(wheel).namelist()
    assert "blocks/_recipes/charlm.py" in names
    assert "blocks/_conf/recipe/tiny_lm.yaml" in names
    assert "hydra_plugins/blocks_ray_launcher/ray_launcher.py" in names  # hydra/launcher=ray
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", *VENV, str(venv)], check=True)
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", *QUIET_LOCAL, str(wheel)],
        check=True,
        env=OUTSIDE_CHECKOUT,
    )
    return venv


def test_installed_cli_finds_recipes_and_presets(installed: Path, tmp_path: Path) -> None:
    blocks = str(installed / "bin" / "blocks")
    where = subprocess.run(
        [installed / "bin" / "python", "-c", "import blocks; print(blocks.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
        env=OUTSIDE_CHECKOUT,
    )
    assert str(installed) in where.stdout, "the wheel, not the checkout, must be imported"
    for recipe in ("charlm", "blobs", "tiny_lm"):
        result = subprocess.run(
            [blocks, "plan", "--json", f"recipe={recipe}", "debug=fast"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=OUTSIDE_CHECKOUT,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["recipe"] == recipe
    listing = subprocess.run(
        [blocks, "list", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
        env=OUTSIDE_CHECKOUT,
    )
    assert {e["name"] for e in json.loads(listing.stdout)} >= {"text", "transformer", "adamw"}


def test_installed_wheel_offers_the_ray_sweep_launcher(installed: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [installed / "bin" / "blocks", "plan", "recipe=blobs", "hydra/launcher=ray"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=OUTSIDE_CHECKOUT,
    )
    assert result.returncode == 0, result.stderr
