"""Block packages: a real ``pip install`` of another team's package, and of broken ones beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import read_summary, run_in_process
from tests.packaging import EXAMPLE, Venv, build_wheel, make_venv, write_package

pytestmark = pytest.mark.slow  # every test reads the venv fixture: a wheel build and six pip installs

BROKEN = """\
BLOCKS_API = 1

raise RuntimeError("the vendored kernels are missing")
"""

TWIN = """\
from dataclasses import dataclass

from blocks import register
from blocks.model import MLP

BLOCKS_API = 1


@register("net")
@dataclass(frozen=True, kw_only=True)
class Net(MLP):
    \"\"\"A twin's net.\"\"\"
"""

# Loaded before acme (namespaces load in name order) and imports acme's blocks: they stay acme's.
BUILDS_ON_ACME = """\
from dataclasses import dataclass

from acme_tabular.blocks import Orchids, ResidualMLP
from blocks import Recipe, recipe, register
from blocks.task import Classification

BLOCKS_API = 1


@register("deep")
@dataclass(frozen=True, kw_only=True)
class Deep(ResidualMLP):
    \"\"\"A deeper residual MLP, built on the acme team's block.\"\"\"

    depth: int = 6


@recipe("deep_orchids")
def deep_orchids() -> Recipe:
    \"\"\"Deep on acme's orchids.\"\"\"
    return Recipe(data=Orchids(), model=Deep(), task=Classification())
"""

FUTURE = TWIN.replace("BLOCKS_API = 1", "BLOCKS_API = 99")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """One venv for the module: the example package, plus a broken, an incompatible and two colliding ones."""
    root = tmp_path_factory.mktemp("packages")
    env = make_venv(root / "venv")
    extra = [
        write_package(root / "broken", "broken-blocks", "broken", "broken_blocks", BROKEN),
        write_package(root / "twin-a", "twin-a", "twin", "twin_a", TWIN),
        write_package(root / "twin-b", "twin-b", "twin", "twin_b", TWIN),
        write_package(root / "future", "future-blocks", "future", "future_blocks", FUTURE),
        write_package(root / "aalab", "aalab-blocks", "aalab", "aalab_blocks", BUILDS_ON_ACME),
    ]
    # blocks itself too (its wheel, built from this checkout), for its pytest11 plugin's metadata.
    env.pip_install(build_wheel(root), EXAMPLE, *extra)
    return env


def test_list_shows_the_package_blocks_with_package_and_version(venv: Venv, tmp_path: Path) -> None:
    result = venv.blocks("list", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    entries = {e["name"]: e for e in json.loads(result.stdout)}
    assert entries["acme/resnet_mlp"]["kind"] == "model"
    assert (entries["acme/resnet_mlp"]["package"], entries["acme/resnet_mlp"]["version"]) == (
        "acme-tabular",
        "1.2.0",
    )
    assert entries["acme/orchids"]["kind"] == "data" and entries["acme/orchids"]["compatible"]
    assert entries["mlp"]["package"] == "blocks", "built-ins are still there"
    assert not entries["future/net"]["compatible"]
    assert entries["aalab/deep"]["package"] == "aalab-blocks"
    assert entries["acme/orchids"]["package"] == "acme-tabular", "imported first by aalab, still acme's"
    assert not any(name.startswith(("twin/", "broken/")) for name in entries)
    table = venv.blocks("list", "model", cwd=tmp_path)
    assert "acme/resnet_mlp" in table.stdout and "acme-tabular 1.2.0" in table.stdout
    assert "INCOMPATIBLE: targets block API 99" in table.stdout


def test_problem_packages_are_named_without_breaking_the_others(venv: Venv, tmp_path: Path) -> None:
    result = venv.blocks("list", "data", cwd=tmp_path)
    assert result.returncode == 0
    warnings = result.stderr
    assert "twin-a 0.3.1 and twin-b 0.3.1 both claim the block namespace 'twin'" in warnings
    assert "broken-blocks 0.3.1" in warnings and "RuntimeError: the vendored kernels are missing" in warnings
    assert "broken_blocks/__init__.py:3" in warnings, "the line that raised is named"
    assert "future-blocks 0.3.1 targets block API 99" in warnings


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("model=broken/net", "broken-blocks 0.3.1 (entry point 'broken' = broken_blocks) failed to import"),
        ("model=twin/net", "twin-a 0.3.1 and twin-b 0.3.1 both claim"),
        ("model=future/net", "future-blocks 0.3.1 targets block API 99"),
    ],
)
def test_a_run_that_uses_a_problem_package_is_refused(
    venv: Venv, tmp_path: Path, override: str, named: str
) -> None:
    result = venv.blocks("plan", "recipe=blobs", override, cwd=tmp_path)
    assert result.returncode == 2
    assert "error package" in result.stderr and named in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_package_presets_and_recipes_compose_and_override(venv: Venv, tmp_path: Path) -> None:
    def plan(*overrides: str) -> dict:
        result = venv.blocks("plan", "--json", *overrides, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    python_recipe = plan("recipe=acme/orchids", "model.width=8")
    model = python_recipe["blocks"]["model"]
    assert model["block"] == "acme/resnet_mlp"
    assert {k: model["fields"][k] for k in ("width", "depth")} == {"width": 8, "depth": 2}
    yaml_recipe = plan("recipe=acme/orchids_wide", "model.depth=1")
    fields = yaml_recipe["blocks"]["model"]["fields"]
    assert {k: fields[k] for k in ("width", "depth")} == {"width": 128, "depth": 1}
    assert yaml_recipe["blocks"]["data"]["block"] == "acme/orchids"
    built_on = plan("recipe=aalab/deep_orchids")
    assert (built_on["blocks"]["model"]["block"], built_on["blocks"]["data"]["block"]) == (
        "aalab/deep",
        "acme/orchids",
    )
    mixed = plan("recipe=blobs", "model=acme/wide")
    assert mixed["blocks"]["model"]["block"] == "acme/resnet_mlp"
    typo = venv.blocks("plan", "recipe=acme/orchids", "model=acme/wide", "model.widht=3", cwd=tmp_path)
    assert typo.returncode == 2 and "did you mean 'width'" in typo.stderr


def test_a_glob_sweep_trains_every_package_model(venv: Venv, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    result = venv.blocks(
        "run",
        "-m",
        "recipe=acme/orchids",
        "model=glob(acme/*)",
        "trainer.max_epochs=1",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "model=acme/resnet_mlp" in result.output and "model=acme/wide" in result.output
    summaries = [read_summary(d) for d in sorted(sweep.iterdir()) if (d / "summary.json").exists()]
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert all(s["global_step"] == 15 for s in summaries)
    none = venv.blocks("plan", "-m", "recipe=blobs", "model=glob(zeta/*)", cwd=tmp_path)
    assert none.returncode == 2 and "matches no option of group 'model'" in none.stderr


@pytest.mark.slow
def test_the_example_package_passes_its_conformance_tests(venv: Venv, tmp_path: Path) -> None:
    """The other team's own tests: blocks' kit through the pytest plugin, DDP included for its model."""
    result = venv.run(
        "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests"), cwd=tmp_path, timeout=600
    )
    assert result.returncode == 0, result.output[-4000:]
    assert "2 passed" in result.stdout


@pytest.mark.slow
def test_a_new_package_installs_and_passes_its_own_test(venv: Venv, tmp_path: Path) -> None:
    created = venv.blocks("new-package", "zeta-blocks", cwd=tmp_path)
    assert created.returncode == 0, created.output
    package = tmp_path / "zeta-blocks"
    assert (package / "src" / "zeta_blocks" / "conf" / "model" / "wide.yaml").is_file()
    venv.pip_install(package)
    listing = venv.blocks("list", "model", "--json", cwd=tmp_path)
    entry = next(e for e in json.loads(listing.stdout) if e["name"] == "zeta/tiny_mlp")
    assert (entry["package"], entry["version"], entry["compatible"]) == ("zeta-blocks", "0.1.0", True)
    preset = venv.blocks("plan", "--json", "recipe=zeta/demo", "model=zeta/wide", cwd=tmp_path)
    assert json.loads(preset.stdout)["blocks"]["model"]["fields"]["hidden"] == 256
    tested = venv.run("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", cwd=package, timeout=600)
    assert tested.returncode == 0, tested.output[-4000:]
    assert "1 passed" in tested.stdout


def test_a_new_package_passes_ruff_as_made(tmp_path: Path) -> None:
    """Regression: the scaffolded package failed ``ruff check`` (its imports' grouping) and ``ruff format
    --check`` (lines past ruff's default length) in its own directory, before a line was changed."""
    import subprocess
    import sys

    from tests.conftest import run_in_process

    assert run_in_process(["new-package", "lint-blocks"], cwd=tmp_path).returncode == 0
    for command in (["check", "--no-cache", "."], ["format", "--no-cache", "--check", "."]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *command],
            cwd=tmp_path / "lint-blocks",
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_new_package_refuses_an_existing_directory_and_a_bad_name(tmp_path: Path) -> None:
    """In this process: a refused scaffold reads no installed package (``venv``'s three CLI starts took ~3 s)."""
    (tmp_path / "taken").mkdir()
    taken = run_in_process(["new-package", "taken"], cwd=tmp_path, apart=True)
    assert taken.returncode == 2 and "already exists; nothing was written" in taken.stderr
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # a link to nothing ended in mkdir's traceback
    dangling = run_in_process(["new-package", "dangling"], cwd=tmp_path, apart=True)
    assert dangling.returncode == 2 and "already exists; nothing was written" in dangling.stderr
    bad = run_in_process(["new-package", "9 lives"], cwd=tmp_path, apart=True)
    assert bad.returncode == 2 and "is not a package name" in bad.stderr
