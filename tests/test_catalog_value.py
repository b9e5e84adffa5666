"""The catalog is a value: built once, passed explicitly, isolated from other catalogs and from Hydra's global store."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
from omegaconf import DictConfig

from blocks.core import jobs
from blocks.core.catalog import Catalog
from blocks.core.config_repo import ConfigRepo
from blocks.core.recipe import RECIPES, Recipe, recipe
from blocks.model import MLP
from blocks.spec.block import Block
from blocks.spec.errors import ConfigError, DuplicateName
from blocks.spec.kinds import KIND_TABLE
from blocks.spec.manifest import BUILTIN_BLOCKS
from blocks.spec.registry import REGISTRY, Entry, register
from tests.catalog_fixtures import fresh_catalog


def test_two_catalogs_in_one_process_do_not_see_each_others_blocks(clean_catalog: Catalog) -> None:
    @register("only_in_a")
    @dataclass(frozen=True, kw_only=True)
    class OnlyInA(MLP):
        """An MLP registered in one catalog only."""

    @recipe("only_in_a_recipe")
    def only_in_a_recipe() -> Recipe:
        return RECIPES.get("blobs").build()

    other = fresh_catalog()
    assert "only_in_a" in clean_catalog.registry.names("model")
    assert "only_in_a" not in other.registry.names("model")
    assert "only_in_a" not in REGISTRY.names("model")
    assert "only_in_a_recipe" not in {e.name for e in other.recipes.entries()}
    assert "only_in_a_recipe" not in {e.name for e in RECIPES.entries()}
    composed = jobs.compose(["recipe=blobs", "model=only_in_a"], catalog=clean_catalog)
    assert composed.choices["model"] == "only_in_a"
    with pytest.raises(ConfigError) as refused:
        jobs.compose(["recipe=blobs", "model=only_in_a"], catalog=other)
    assert refused.value.problems[0].key == "model"


def test_a_stored_option_is_never_overwritten_by_another_source() -> None:
    repo = ConfigRepo()
    repo.add("optim", "fast", {"lr": 1.0}, source="first.yaml")
    repo.add("optim", "fast", {"lr": 1.0}, source="first.yaml")  # the same source again: fine
    with pytest.raises(DuplicateName) as clash:
        repo.add("optim", "fast", {"lr": 2.0}, source="second.yaml")
    assert "first.yaml" in str(clash.value) and "second.yaml" in str(clash.value)


def _entries(repo: dict[str, object], prefix: str = "") -> dict[str, int]:
    """Every stored config of Hydra's ConfigStore by path, as the identity of its stored object (nothing is built)."""
    found: dict[str, int] = {}
    for key, value in repo.items():
        if isinstance(value, dict):
            found |= _entries(value, f"{prefix}{key}/")
        else:
            found[prefix + key] = id(value)
    return found


def test_hydras_store_sees_a_catalog_only_while_composing_and_keeps_others_entries() -> None:
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(group="optim", name="someone_elses", node={"lr": 1.0}, provider="another-library")
    try:
        before = _entries(store.repo)
        repo = ConfigRepo()
        repo.add("optim", "ours_only", {"lr": 3.0}, source="ours.yaml")
        with repo.installed():
            assert "ours_only.yaml" in store.repo["optim"]
            assert "someone_elses.yaml" in store.repo["optim"]
        assert _entries(store.repo) == before
        clashing = ConfigRepo()
        clashing.add("optim", "someone_elses", {"lr": 2.0}, source="ours.yaml")
        with pytest.raises(DuplicateName) as clash:
            clashing.install()
        assert "another-library" in str(clash.value) and "ours.yaml" in str(clash.value)
        assert _entries(store.repo) == before
    finally:
        del store.repo["optim"]["someone_elses.yaml"]


def test_a_catalog_builds_each_chosen_node_once_and_compositions_never_change_it(
    clean_catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    import blocks.core.catalog as catalog_module

    built: list[str] = []
    block_node = catalog_module.block_node

    def counting_block_node(block: Block) -> DictConfig:
        built.append(type(block).__name__)
        return block_node(block)

    monkeypatch.setattr(catalog_module, "block_node", counting_block_node)
    first = jobs.compose(["recipe=blobs", "optim.lr=0.5", "trainer.max_steps=3"], catalog=clean_catalog)
    once = sorted(built)
    assert once, "the first composition builds the chosen blocks' nodes"
    second = jobs.compose(["recipe=blobs"], catalog=clean_catalog)
    assert sorted(built) == once, "a second composition of the same catalog builds no node again"
    assert first.config.optim.lr == 0.5
    assert second.config.optim.lr != 0.5, "an override of one composition leaked into the shared node"
    jobs.compose(["recipe=blobs"], catalog=fresh_catalog())
    assert len(built) == 2 * len(once), "another catalog builds its own nodes"


def test_a_chosen_block_whose_module_cannot_be_imported_is_named_with_the_import_error() -> None:
    catalog = fresh_catalog()
    catalog.registry.add_entry(
        Entry("model", "needs_timm", "timm_blocks_missing:Resnet", "vision-blocks", "0.2")
    )
    with pytest.raises(ConfigError) as refused:
        jobs.plan(["recipe=blobs", "model=needs_timm", "optim.lrr=1"], catalog=catalog)
    problems = {p.key: p for p in refused.value.problems}
    assert "model block 'needs_timm'" in problems["model"].message
    assert "No module named 'timm_blocks_missing'" in problems["model"].message
    assert "vision-blocks" in problems["model"].fix and "blocks list model" in problems["model"].fix
    assert "did you mean 'lr'" in problems["optim.lrr"].message, "the other problems are still reported"


CHOSEN_BY_DEFAULT = {
    "data": "text",
    "model": "transformer",
    "task": "lm",
    "optim": "adamw",
    "strategy": "single",
}

PLAN_AND_REPORT_MODULES = """
import json, sys
from blocks.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def test_planning_the_default_recipe_imports_only_the_chosen_blocks_and_no_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PLAN_AND_REPORT_MODULES, "plan", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert json.loads(proc.stdout)["valid"], proc.stdout[-2000:]
    modules = set(json.loads(proc.stderr.strip().splitlines()[-1]))
    block_modules = {target.split(":")[0] for names in BUILTIN_BLOCKS.values() for target in names.values()}
    chosen = {BUILTIN_BLOCKS[kind][name].split(":")[0] for kind, name in CHOSEN_BY_DEFAULT.items()}
    # precision, checkpoint, monitor and trainer take their kind's default block
    defaults = {
        BUILTIN_BLOCKS[k.name][k.default].split(":")[0] for k in KIND_TABLE if k.name not in CHOSEN_BY_DEFAULT
    }
    assert block_modules & modules == chosen | defaults
    assert not modules & {"torch", "lightning", "pytorch_lightning"}


def test_the_manifest_lists_exactly_what_the_block_modules_register() -> None:
    script = """
import importlib, json, pkgutil
from blocks.spec.kinds import KIND_TABLE
from blocks.spec.registry import REGISTRY
for kind in KIND_TABLE:
    package = importlib.import_module(kind.package)
    for info in pkgutil.walk_packages(package.__path__, kind.package + "."):
        importlib.import_module(info.name)
print(json.dumps([[e.kind, e.name, e.target, e.registered is not None] for e in REGISTRY.entries()]))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    registered = {(kind, name): target for kind, name, target, done in json.loads(proc.stdout) if done}
    listed = {
        (kind, name): target for kind, names in BUILTIN_BLOCKS.items() for name, target in names.items()
    }
    assert registered == listed


def test_a_new_catalog_lists_every_built_in_block_without_importing_one() -> None:
    script = """
import json, sys
from blocks.core.catalog import build_catalog
catalog = build_catalog(with_packages=False, with_project=False)
print(json.dumps({"names": [[e.kind, e.name] for e in catalog.registry.entries()], "modules": sorted(sys.modules)}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    found = json.loads(proc.stdout)
    assert sorted(map(tuple, found["names"])) == sorted(
        (k, n) for k, names in BUILTIN_BLOCKS.items() for n in names
    )
    block_modules = {target.split(":")[0] for names in BUILTIN_BLOCKS.values() for target in names.values()}
    kind_bases = {
        kind.base.split(":")[0] for kind in KIND_TABLE
    }  # a Recipe's field types; some define a block too
    assert not (block_modules - kind_bases) & set(found["modules"])


def test_kind_packages_still_export_their_blocks() -> None:
    for kind in KIND_TABLE:
        package = importlib.import_module(kind.package)
        assert sorted(package.__all__) == dir(package)
        for name in package.__all__:
            assert getattr(package, name) is not None


def test_hydra_initialized_without_its_stack_walk_composes_as_hydra_initialize_does() -> None:
    from hydra import compose, initialize

    from blocks.core.catalog import current

    with jobs.hydra_context() as name:
        ours = compose(name, overrides=["recipe=blobs", "optim.lr=0.5"])
    with current().installed(), initialize(version_base="1.3", config_path=None, job_name="blocks"):
        hydras = compose(name, overrides=["recipe=blobs", "optim.lr=0.5"])
    assert ours == hydras and ours.optim.lr == 0.5


def test_recipe_presets_are_options_before_their_recipe_is_chosen(clean_catalog: Catalog) -> None:
    composed = jobs.compose(["recipe=blobs", "trainer=charlm"], catalog=clean_catalog)
    assert composed.config.trainer.max_steps == 400
    with pytest.raises(ConfigError) as unknown:
        jobs.compose(["data=stram"], catalog=clean_catalog)
    (problem,) = unknown.value.problems
    assert "streamlm" in problem.fix and "stream" in problem.message
