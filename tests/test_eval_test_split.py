"""``blocks eval --split test``: a held-out test split that is never another split's samples."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from blocks.core.catalog import Catalog
from blocks.core.checks import SHARDS, write_shard_manifest
from blocks.data.base import SPLITS, DataBlock
from blocks.data.blobs import Blobs
from blocks.data.bundled import Diabetes, Digits
from blocks.spec.errors import BlocksError
from blocks.spec.registry import REGISTRY
from tests.conftest import run_in_process

# How to make each built-in data block without files of its own (a new one must be added here).
BUILT_IN = {
    "blobs": lambda: Blobs(),
    "digits": lambda: Digits(),
    "diabetes": lambda: Diabetes(),
    "text": lambda: REGISTRY.get("data", "text").cls(),
    "stream": lambda: REGISTRY.get("data", "stream").cls(path=SHARDS),
    "lightning_data": lambda: REGISTRY.get("data", "lightning_data").cls(
        target="blocks.nowhere.Module", train_samples=100, val_samples=10
    ),
}


def test_every_built_in_data_block_has_no_test_split_unless_configured(clean_catalog: Catalog) -> None:
    write_shard_manifest()
    built_in = set(clean_catalog.registry.names("data"))
    assert built_in == set(BUILT_IN), "add the new data block to BUILT_IN"
    for name in sorted(built_in):
        block: DataBlock = BUILT_IN[name]()
        assert block.num_samples("train") > 0, name
        assert block.num_samples("test") == 0, (
            f"data={name} reports samples for a test split it does not have"
        )
        assert block.num_samples("no-such-split") == 0, name
    assert "test" in SPLITS


def test_test_fraction_carves_a_disjoint_test_split() -> None:
    for block, test in ((Blobs(samples=200, test_fraction=0.2), 40), (Digits(test_fraction=0.1), 179)):
        sizes = {s: block.num_samples(s) for s in SPLITS}
        assert sizes["test"] == test and sum(sizes.values()) == (200 if isinstance(block, Blobs) else 1797)
        rows = {s: {tuple(x.tolist()) for x in block.build(s).inputs} for s in SPLITS}
        assert {s: len(block.build(s)) for s in SPLITS} == sizes
        assert not rows["test"] & rows["train"] and not rows["test"] & rows["val"]


def _digest(dataset) -> str:
    h = hashlib.sha256()
    for tensor in (dataset.inputs, dataset.targets):
        h.update(tensor.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# Sizes and digests of the train and val sets computed with the code before the test split existed.
BEFORE = {
    "Blobs": {"train": (231, "00706890da6be0e9"), "val": (25, "36fc18b94c5eb124")},
    "Digits": {"train": (1438, "80916c7b7a28a644"), "val": (359, "2bcbe2b4ac134a6b")},
    "Diabetes": {"train": (354, "4904faebfe23cd8c"), "val": (88, "d8f973c0c48ab7f8")},
}


@pytest.mark.parametrize("block", [Blobs(samples=256), Digits(), Diabetes()], ids=lambda b: type(b).__name__)
def test_without_a_test_fraction_train_and_val_are_unchanged(block: DataBlock) -> None:
    got = {s: (len(ds), _digest(ds)) for s in ("train", "val") for ds in [block.build(s)]}
    assert got == BEFORE[type(block).__name__]
    assert len(block.build("test")) == 0


def test_checkpoint_digests_ignore_an_unset_test_fraction() -> None:
    from blocks.checkpoint.store import block_digests

    data = {"_block_": "blobs", "samples": 64, "val_fraction": 0.1}
    assert block_digests({"data": data}) == block_digests({"data": {**data, "test_fraction": 0.0}})
    assert block_digests({"data": data}) != block_digests({"data": {**data, "test_fraction": 0.2}})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny blobs run with a test split and one without."""
    root = tmp_path_factory.mktemp("test-split")
    made = {}
    for name, extra in (("with", ["data.test_fraction=0.2"]), ("without", [])):
        common = ["recipe=blobs", "data.samples=500", "trainer.max_steps=5", "checkpoint.enabled=false"]
        result = run_in_process(["run", *common, *extra, f"hydra.run.dir={root / name}"], cwd=root)
        assert result.returncode == 0, result.output[-3000:]
        made[name] = root / name
    return made


@pytest.mark.slow  # shares two tiny training runs (~25 s)
def test_eval_scores_the_test_split(runs: dict[str, Path]) -> None:
    from blocks.launch.evaluate import evaluate

    test = evaluate(str(runs["with"]), split="test")
    val = evaluate(str(runs["with"]), split="val")
    assert test and all(k.startswith("test/") for k in test)
    assert {k.removeprefix("test/") for k in test} == {k.removeprefix("val/") for k in val}
    assert test != {k.replace("val/", "test/"): v for k, v in val.items()}  # other samples
    block = Blobs(samples=500, test_fraction=0.2)
    assert len(block.build("test")) == block.num_samples("test") == 100


@pytest.mark.slow  # shares two tiny training runs (~25 s)
def test_eval_without_a_test_split_names_the_flag_and_the_fix(runs: dict[str, Path]) -> None:
    from blocks.launch.evaluate import evaluate

    with pytest.raises(BlocksError) as info:
        evaluate(str(runs["without"]), split="test")
    (problem,) = info.value.problems
    assert problem.key == "--split" and "data=blobs has no test split" in problem.message
    assert "data.test_fraction=0.1 at train time" in problem.fix


@pytest.mark.slow  # shares two tiny training runs (~25 s)
def test_eval_refuses_a_test_fraction_the_run_did_not_train_with(runs: dict[str, Path]) -> None:
    from blocks.launch.evaluate import evaluate

    with pytest.raises(BlocksError) as info:
        evaluate(str(runs["without"]), ["data.test_fraction=0.2"], split="test")
    assert info.value.problems[0].key == "data.test_fraction"


def test_lightning_data_uses_the_datamodules_test_dataloader(monkeypatch, tmp_path: Path) -> None:
    from blocks.data.adapter import LightningData
    from blocks.spec.errors import ConfigError

    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests,lead_test_dm")
    (tmp_path / "lead_test_dm.py").write_text(
        "from torch.utils.data import DataLoader\n"
        "from tests.legacy_team import ClustersDM\n"
        "class WithTest(ClustersDM):\n"
        "    def test_dataloader(self):\n"
        "        return DataLoader(self.val_set, batch_size=64)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    common = dict(num_features=8, num_classes=3, train_samples=192, val_samples=64)
    with_test = LightningData(target="lead_test_dm.WithTest", test_samples=64, **common)
    assert with_test.num_samples("test") == 64 and len(with_test.build("test")) == 64
    without = LightningData(target="tests.legacy_team.ClustersDM", test_samples=64, **common)
    with pytest.raises(ConfigError) as info:
        without.build("test")
    assert info.value.problems[0].key == "data.test_samples" and "no test_dataloader()" in str(info.value)
    assert without.replace(test_samples=0).num_samples("test") == 0


@pytest.mark.slow  # shares two tiny training runs (~25 s)
def test_eval_refuses_any_override_that_moves_trained_samples_into_the_scored_split(
    runs: dict[str, Path],
) -> None:
    from blocks.launch.evaluate import evaluate

    refused = (
        ("data.seed=1", "test"),
        ("data.val_fraction=0.3", "test"),
        ("data.val_fraction=0.5", "val"),
        ("data.samples=600", "val"),
        ("data=blobs", "test"),  # the block's defaults: another sample count
    )
    for override, split in refused:
        with pytest.raises(BlocksError) as info:
            evaluate(str(runs["with"]), [override], split=split)
        (problem,) = info.value.problems
        field = "samples" if override == "data=blobs" else override.split("=")[0].removeprefix("data.")
        assert problem.key == f"data.{field}" and "samples the model saw in training" in problem.message
    after_options = run_in_process(
        ["eval", str(runs["with"]), "--split", "test", "data.seed=1"], cwd=runs["with"]
    )
    assert after_options.returncode == 2 and "error data.seed: is 1" in after_options.output, (
        after_options.output
    )
    assert evaluate(str(runs["with"]), ["data.batch_size=7"], split="test")  # reading fields are free
    assert evaluate(str(runs["with"]), ["data.seed=1"], split="train")
