"""A run records which distribution and version provided each block; eval, export, load_model and resume say when that changed.

The block package here is a module plus a ``*.dist-info`` on ``sys.path`` (what ``pip install``
leaves behind), discovered in this process the way ``blocks`` discovers an installed one.
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blocks.core import catalog, packages
from blocks.core.recipe import RECIPES
from blocks.spec.registry import REGISTRY
from tests.conftest import run_in_process

NAMESPACE, MODULE, DIST = "verpkg", "verpkg_blocks", "verpkg-blocks"

SOURCE = '''
from dataclasses import dataclass

from blocks import register
from blocks.model import ModelBlock

BLOCKS_API = 1


@register("net")
@dataclass(frozen=True, kw_only=True)
class Net(ModelBlock):
    """A linear classifier of feature vectors."""

    def num_parameters(self, spec):
        """Its weights and biases."""
        return spec.num_features * spec.num_classes + spec.num_classes

    def build(self, spec):
        """The network for *spec*."""
        from torch import nn

        return nn.Linear(spec.num_features, spec.num_classes)
'''

TINY = ["recipe=blobs", f"model={NAMESPACE}/net", "data.samples=300", "monitor.progress=off"]


def _install(site: Path, version: str, source: str) -> None:
    """``pip install`` as far as discovery sees it: the module and its dist-info with a ``blocks`` entry point."""
    shutil.rmtree(site, ignore_errors=True)
    (site / MODULE).mkdir(parents=True)
    (site / MODULE / "__init__.py").write_text(source)
    info = site / f"{MODULE}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[blocks]\n{NAMESPACE} = {MODULE}\n")


@pytest.fixture
def install(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable]:
    """``install(version, source)``: (re)install the package and discover it afresh, as a new process would."""
    site = tmp_path_factory.mktemp("site")
    monkeypatch.syspath_prepend(str(site))
    for name, value in [("_discovered", False), ("_packages", {}), ("_problems", {})]:
        monkeypatch.setattr(packages, name, value)
    monkeypatch.setattr(REGISTRY, "owner", REGISTRY.owner)
    monkeypatch.setattr(RECIPES, "owner", RECIPES.owner)
    monkeypatch.setattr(REGISTRY, "package_modules", list(REGISTRY.package_modules))
    monkeypatch.setattr(catalog, "_default", None)

    def install(version: str, source: str = SOURCE) -> None:
        REGISTRY.drop_namespace(NAMESPACE)
        sys.modules.pop(MODULE, None)
        _install(site, version, source)
        import importlib

        importlib.invalidate_caches()
        packages._discovered = False
        packages._packages.clear()
        packages._problems.clear()
        catalog._default = None
        catalog.load()

    yield install
    REGISTRY.drop_namespace(NAMESPACE)
    sys.modules.pop(MODULE, None)


def _train(root: Path, run_dir: Path, *overrides: str) -> str:
    result = run_in_process(["run", *TINY, *overrides, f"hydra.run.dir={run_dir}"], cwd=root)
    assert result.returncode == 0, result.output[-3000:]
    return result.output


def test_eval_export_load_model_and_resume_say_a_block_package_was_upgraded_since_training(
    install: Callable, tmp_path: Path
) -> None:
    from blocks.launch.evaluate import evaluation
    from blocks.runtime.load import load_model

    install("0.1.0")
    run = tmp_path / "run"
    _train(tmp_path, run, "trainer.max_steps=3")
    recorded = json.loads((run / "plan.json").read_text())["packages"]
    assert recorded["model"] == {"block": f"{NAMESPACE}/net", "distribution": DIST, "version": "0.1.0"}
    assert recorded["data"]["distribution"] == "blocks"
    old = tmp_path / "old"  # a run dir written before versions were recorded
    shutil.copytree(run, old)
    frozen = json.loads((old / "plan.json").read_text())
    del frozen["packages"]
    (old / "plan.json").write_text(json.dumps(frozen))

    install("0.3.0")  # same fields, other code
    line = f"model={NAMESPACE}/net: the run used {DIST} 0.1.0, {DIST} 0.3.0 is installed"
    said = run_in_process(["eval", str(run)], cwd=tmp_path)
    assert said.returncode == 0 and f"note: {line}" in said.output, said.output
    # Regression: --json dropped the note; a program reads the metrics alone on stdout, the note is on stderr.
    said = run_in_process(["eval", str(run), "--json"], cwd=tmp_path, apart=True)
    assert said.returncode == 0 and set(json.loads(said.stdout)) == {"val/loss", "val/accuracy"}
    assert f"note: {line}" in said.stderr and "weights: " in said.stderr, said.stderr
    assert not [n for n in evaluation(str(old)).notes if DIST in n], "no record, no note"
    said = run_in_process(["export", str(run), str(tmp_path / "export")], cwd=tmp_path)
    assert said.returncode == 0 and f"note: {line}" in said.output, said.output
    exported = json.loads((tmp_path / "export" / "model.json").read_text())["packages"]
    assert exported["model"]["version"] == "0.1.0", "the export records what the weights were trained with"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_model(tmp_path / "export")
    assert any(f"{DIST} 0.1.0, {DIST} 0.3.0 is installed" in str(w.message) for w in caught)
    (step_3,) = (run / "checkpoints").glob("step-*")
    copied = tmp_path / "elsewhere" / step_3.name  # a checkpoint copied out of its run dir
    shutil.copytree(step_3, copied)
    _train(tmp_path, run, "trainer.max_steps=4")  # resumes step 3
    log = (run / "blocks.log").read_text()
    assert "WARNING" in log and f"the checkpoint resumed was trained with {DIST} 0.1.0, {DIST} 0.3.0" in log
    # Regression: the resume rewrote plan.json (0.3.0), and step 3 was said to be as installed.
    said = run_in_process(["eval", str(step_3)], cwd=tmp_path)
    assert said.returncode == 0 and f"note: {line}" in said.output, said.output
    # Regression: a checkpoint resumed from elsewhere was compared with no record (or the run dir's own).
    _train(tmp_path, tmp_path / "fresh", "trainer.max_steps=4", f"checkpoint.resume={copied}")
    log = (tmp_path / "fresh" / "blocks.log").read_text()
    assert f"the checkpoint resumed was trained with {DIST} 0.1.0, {DIST} 0.3.0" in log, log


def test_eval_export_and_load_model_of_a_run_name_the_package_that_failed_to_import(
    install: Callable, tmp_path: Path
) -> None:
    from blocks.runtime.load import load_model
    from blocks.spec.errors import BlocksError

    install("0.1.0")
    run = tmp_path / "run"
    _train(tmp_path, run, "trainer.max_steps=2")
    assert run_in_process(["export", str(run), str(tmp_path / "export")], cwd=tmp_path).returncode == 0

    install("0.2.0", 'raise RuntimeError("the acme bug")\n' + SOURCE)
    for args in (["eval", str(run)], ["export", str(run), str(tmp_path / "again")]):
        said = run_in_process(args, cwd=tmp_path)
        assert said.returncode == 2, said.output
        assert f"{DIST} 0.2.0" in said.output and "failed to import" in said.output, said.output
        assert "the acme bug" in said.output and "install the block package" not in said.output
    with pytest.raises(BlocksError, match="failed to import: RuntimeError: the acme bug"):
        load_model(tmp_path / "export")


def test_a_blocks_upgrade_under_a_run_of_built_ins_is_one_note() -> None:
    """Regression: one note per kind, nine identical lines for a run of built-in blocks only."""
    from blocks.core import jobs
    from blocks.core.provenance import block_sources, version_notes

    plan = jobs.plan(["recipe=blobs"])
    recorded = {kind: {**source, "version": "0.0.9"} for kind, source in block_sources(plan.blocks).items()}
    (note,) = version_notes(recorded, plan.blocks)
    assert "the run used blocks 0.0.9, blocks" in note
    assert all(f"{kind}=" in note for kind in ("data", "model", "optim", "trainer")), note
