"""A user's data and model blocks are held to what they declare: the batch spec and the split sizes.

A broken declaration need not fail on its own: a regression loss broadcasts ``[B, 1]`` against
``[B]`` and trains a useless model, cross-entropy takes more logits than classes, a split longer
than declared trains more epochs than planned. Each is an error naming the block and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from blocks import register
from blocks.core import catalog, jobs
from blocks.data.base import BatchSpec, DataBlock, FeatureBatch, RegressionBatch, TokenBatch
from blocks.launch import driver
from blocks.spec.errors import BlocksError
from blocks.spec.registry import REGISTRY
from blocks.testing import ConformanceError, check_split_sizes

LINE = ["recipe=diabetes_mlp", "data=contract/line", "monitor.progress=off", "checkpoint.enabled=false"]
TINY_NET = [
    "recipe=blobs",
    "data.num_classes=2",
    "model=torch_module",
    "model.target=tests.legacy_team.TinyNet",
    "model.spec_args={in_features:num_features}",
]


class Points(Dataset):
    """Points of y = 2x + 1, as dicts of tensors, or in the shapes a new user gets wrong."""

    def __init__(self, size: int, items: str) -> None:
        self.x = torch.linspace(-1, 1, size).unsqueeze(1)
        self.items = items

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> Any:
        x = self.x[index]
        y = 2 * x + 1
        if self.items == "pairs":
            return x, y
        return {"inputs": x, "targets": y[0] if self.items == "scalar_targets" else y}


@dataclass(frozen=True, kw_only=True)
class Line(DataBlock):
    """A user's regression data block: points of y = 2x + 1.

    Attributes:
        samples: training samples built.
        declared: training samples ``num_samples('train')`` reports (0: ``samples``).
        declared_val: validation samples ``num_samples('val')`` reports.
        items: ``dicts``, ``scalar_targets`` (targets of shape [] rather than [1]) or ``pairs`` ((x, y) tuples).
    """

    samples: int = 64
    declared: int = 0
    declared_val: int = 16
    items: str = "dicts"

    def batch_spec(self) -> BatchSpec:
        """One feature, one target."""
        return RegressionBatch(num_features=1, num_targets=1)

    def num_samples(self, split: str) -> int:
        """The declared sizes."""
        return {"train": self.declared or self.samples, "val": self.declared_val}.get(split, 0)

    def build(self, split: str) -> Dataset:
        """The points of *split*."""
        return Points(self.samples if split == "train" else 16, self.items)


@pytest.fixture(scope="module", autouse=True)
def line_block() -> None:
    with REGISTRY.namespace("contract", "contract-test-blocks", "0.0.1"):
        register("line")(Line)
    catalog.register_configs()


@pytest.fixture(autouse=True)
def allow_legacy_team(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests.legacy_team")


def test_targets_that_would_broadcast_fail_the_run_before_its_first_step(tmp_path: Path) -> None:
    """Targets [B] for RegressionBatch(num_targets=1) trained a useless model and the run said completed."""
    with pytest.raises(BlocksError) as info:
        driver.run([*LINE, "data.items=scalar_targets", "trainer.max_steps=2"], tmp_path)
    (problem,) = info.value.problems
    assert problem.key == "data"
    assert "data=contract/line (Line) yields targets float32[32]" in problem.message
    assert "needs float[32, 1]" in problem.message
    assert "torch.tensor([y]) rather than torch.tensor(y)" in problem.fix
    assert '"global_step": 0' in (tmp_path / "summary.json").read_text()


@pytest.mark.parametrize(
    ("args", "key", "said"),
    [
        (
            [*LINE, "data.items=pairs"],
            "data",
            "yields batches of list (its items are (inputs, targets) pairs)",
        ),
        ([*TINY_NET, "model.kwargs={num_classes:3}"], "model.target", "one logit per class (num_classes=2)"),
        ([*TINY_NET, "model.kwargs={num_classes:1}"], "model.target", "needs outputs float[32, 2]"),
    ],
    ids=["pairs", "more-logits", "fewer-logits"],
)
def test_the_first_batch_and_the_models_outputs_are_checked_against_the_spec(
    args: list[str], key: str, said: str
) -> None:
    """What failed mid-training with a TypeError, at the first validation, or with 'Target out of bounds'."""
    from blocks.runtime.datamodule import collate
    from blocks.runtime.module import BlocksModule

    plan = jobs.plan(args)
    module = BlocksModule(
        plan.model, plan.task, plan.optim, plan.data.batch_spec(), total_steps=1, data=plan.data
    )
    batch = next(iter(DataLoader(plan.data.build("train"), batch_size=32, collate_fn=collate)))
    with pytest.raises(BlocksError) as info:
        module.training_step(batch, 0)
    (problem,) = info.value.problems
    assert problem.key == key and said in problem.message, problem
    assert problem.fix


def test_a_split_of_another_length_than_declared_is_refused() -> None:
    from blocks.runtime.datamodule import BlocksDataModule

    plan = jobs.plan([*LINE, "data.declared=128"])
    with pytest.raises(BlocksError, match=r"declares 128 train samples .* a dataset of 64") as info:
        BlocksDataModule(plan.data, derived=plan.derived, seed=0).setup("fit")
    assert "Line.num_samples('train')" in info.value.problems[0].fix
    with pytest.raises(
        ConformanceError, match=r"num_samples\('train'\) is 128 but build\('train'\) returns a dataset of 64"
    ):
        check_split_sizes("contract/line", ["data.declared=128"])
    assert check_split_sizes("contract/line") == {"train": 64, "val": 16}


@pytest.mark.parametrize(
    ("override", "split"), [("data.declared=-5", "train"), ("data.declared_val=-3", "val")]
)
def test_a_negative_sample_count_is_a_plan_error(override: str, split: str) -> None:
    """Regression: a negative validation count planned as valid (only training samples < 1 were refused)."""
    plan = jobs.plan([*LINE, override])
    (problem,) = [p for p in plan.errors if p.check == "split-count"]
    assert problem.key == "data" and f"num_samples('{split}') is negative" in problem.message
    assert f"Line.num_samples('{split}')" in problem.fix


def test_regression_refuses_outputs_and_targets_of_other_shapes() -> None:
    from blocks.task.objectives import RegressionObjective

    objective = RegressionObjective(num_targets=1)
    with pytest.raises(BlocksError, match=r"shape \[4, 1\] and targets of shape \[4\] differ"):
        objective.loss(torch.zeros(4, 1), {"targets": torch.zeros(4)})
    with pytest.raises(BlocksError, match="differ"):
        objective.update(torch.zeros(4, 1), {"targets": torch.zeros(4)})


@dataclass(frozen=True, kw_only=True)
class Table(Line):
    """A data block with a field named like an adapter's, which is no import path: the column to predict."""

    target: str = "price"


class MeanAndVariance(torch.nn.Module):
    """A package's objective that reads outputs of a layout of its own (a mean and a log-variance per target)."""


def _batch(inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"inputs": inputs, "targets": targets}


@pytest.mark.parametrize(
    ("spec", "batch", "outputs", "objective"),
    [
        (
            {"seq_len": 8, "vocab_size": 256},
            _batch(torch.zeros(2, 8, dtype=torch.int64), torch.zeros(2, 8, dtype=torch.int64)),
            torch.zeros(2, 8, 320),
            "lm",
        ),
        (
            {"num_features": 16, "num_classes": 2},
            _batch(torch.zeros(2, 16, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)),
            torch.zeros(2, 2),
            "classify",
        ),
        (
            {"num_features": 16, "num_classes": 2},
            _batch(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.uint8)),
            torch.zeros(2, 2),
            "classify",
        ),
        (
            {"num_features": 16, "num_classes": 4},
            _batch(torch.zeros(2, 16), torch.full((2, 4), 0.25)),
            torch.zeros(2, 4),
            "classify",
        ),
        (
            {"num_features": 1, "num_targets": 1},
            _batch(torch.zeros(2, 1), torch.zeros(2, 1)),
            torch.zeros(2, 2),
            "own",
        ),
        (
            {"seq_len": 8, "vocab_size": 256},
            _batch(torch.zeros(2, 8, dtype=torch.int64), torch.zeros(2, 8, dtype=torch.int64)),
            torch.zeros(16, 256),
            "lm",
        ),
        (
            {"num_features": 1, "num_targets": 1},
            _batch(torch.zeros(2, 1), torch.zeros(2, 1, dtype=torch.int64)),
            torch.zeros(2, 1),
            "regress",
        ),
        (
            {"num_features": 1, "num_targets": 1},
            _batch(torch.zeros(2, 1), torch.zeros(2, 3, dtype=torch.int64)),
            torch.zeros(2, 2),
            "own",
        ),
    ],
    ids=[
        "padded-vocab",
        "integer-features",
        "uint8-images-and-labels",
        "class-probabilities",
        "own-output-layout",
        "flattened-logits",
        "integer-regression-targets",
        "own-target-layout",
    ],
)
def test_what_the_spec_and_the_task_allow_is_not_refused(
    spec: dict[str, int], batch: dict[str, torch.Tensor], outputs: torch.Tensor, objective: str
) -> None:
    """Review of the contract: each of these trained before it and was refused by its first version.

    A language model over a padded vocabulary, token ids or uint8 pixels a model embeds or
    normalizes itself, class probabilities (mixup, soft labels: cross-entropy takes them), and a
    package's task scoring outputs of its own layout.
    """
    from blocks.data.base import FeatureBatch, TokenBatch
    from blocks.runtime.contract import BatchContract
    from blocks.task.objectives import ClassificationObjective, NextTokenObjective, RegressionObjective

    batch_spec: BatchSpec = (
        TokenBatch(**spec)
        if "vocab_size" in spec
        else FeatureBatch(**spec)
        if "num_classes" in spec
        else RegressionBatch(**spec)
    )
    scorer = {
        "lm": NextTokenObjective(),
        "classify": ClassificationObjective(num_classes=spec.get("num_classes", 2)),
        "regress": RegressionObjective(num_targets=1),
        "own": MeanAndVariance(),
    }[objective]
    contract = BatchContract.of_run(batch_spec, None, None, scorer)
    contract.check_batch(batch)
    contract.check_outputs(outputs, batch)
    if objective == "own" and batch["targets"].shape == (2, 1):  # the built-in regression task: refused there
        with pytest.raises(BlocksError, match=r"needs outputs float\[2, 1\]"):
            BatchContract.of_run(batch_spec, None, None, RegressionObjective(num_targets=1)).check_outputs(
                outputs, batch
            )
    if objective == "lm":  # fewer logits than the data's vocabulary: refused
        with pytest.raises(BlocksError, match=r"needs outputs float\[2, 8, >=256\]"):
            contract.check_outputs(torch.zeros(2, 8, 200), batch)


def test_a_field_named_target_outside_an_adapter_is_no_import_path() -> None:
    """A block's ``target`` column was taken for an adapter's import path: the key read ``data.target``."""
    from blocks.runtime.contract import BatchContract

    contract = BatchContract(RegressionBatch(num_features=1, num_targets=1), Table(), None)
    with pytest.raises(BlocksError) as info:
        contract.check_batch(_batch(torch.zeros(2, 1), torch.zeros(2)))
    (problem,) = info.value.problems
    assert problem.key == "data" and "(Table)" in problem.message and "price" not in problem.message


def test_the_classification_and_lm_tasks_take_what_the_contract_lets_through() -> None:
    """Class probabilities were scored as labels (accuracy 0.67 for perfect logits); int32 ids failed in cross-entropy.

    The contract accepts class labels of any integer dtype and class probabilities, so the
    built-in objectives must score them: labels as int64, probabilities against their argmax.
    """
    from blocks.task.objectives import ClassificationObjective, NextTokenObjective

    labels = torch.tensor([0, 1, 2])
    perfect = torch.nn.functional.one_hot(labels, 3).float() * 10
    for targets in (labels, labels.to(torch.int32), torch.nn.functional.one_hot(labels, 3).float()):
        objective = ClassificationObjective(num_classes=3)
        assert objective.loss(perfect, {"targets": targets}).item() < 1e-3
        objective.update(perfect, {"targets": targets})
        assert objective.compute()["accuracy"].item() == 1.0, targets.dtype
    tokens = torch.zeros(2, 4, dtype=torch.int32)
    lm = NextTokenObjective()
    assert lm.loss(torch.zeros(2, 4, 5), {"targets": tokens}).item() > 0
    lm.update(torch.zeros(2, 4, 5), {"targets": tokens})
    assert lm.compute()["loss"].item() > 0


@pytest.mark.parametrize(
    ("spec", "batch", "said", "fix"),
    [
        (
            FeatureBatch(num_features=2, num_classes=3),
            _batch(torch.zeros(4, 2), torch.tensor([1, 2, 3, 3])),
            "targets ids from 1 to 3, but its batch_spec() FeatureBatch(num_features=2, num_classes=3) has "
            "num_classes=3: ids must lie in 0..2",
            "make batch_spec() declare num_classes=4",
        ),
        (
            FeatureBatch(num_features=2, num_classes=3),
            _batch(torch.zeros(4, 2), torch.tensor([0, -1, 2, 1], dtype=torch.int32)),
            "targets ids from -1 to 2",
            "ids count from 0 and stay below num_classes=3",
        ),
        (
            TokenBatch(seq_len=3, vocab_size=5),
            _batch(torch.tensor([[0, 1, 5]]), torch.tensor([[1, 4, 4]])),
            "inputs ids from 0 to 5, but its batch_spec() TokenBatch(vocab_size=5, seq_len=3) has vocab_size=5",
            "make batch_spec() declare vocab_size=6",
        ),
    ],
    ids=["labels-from-1", "negative-label", "token-beyond-vocab"],
)
def test_ids_outside_the_declared_count_are_refused_at_the_first_batch(
    spec: BatchSpec, batch: dict[str, torch.Tensor], said: str, fix: str
) -> None:
    """Regression: class labels counted from 1 or token ids beyond the vocabulary passed the contract.

    On a CPU they failed later in cross-entropy or the embedding naming neither block; on a GPU
    as a device-side assert that ends the process.
    """
    from blocks.runtime.contract import BatchContract

    with pytest.raises(BlocksError) as info:
        BatchContract(spec, Line(), None).check_batch(batch)
    (problem,) = info.value.problems
    assert problem.key == "data" and "data=contract/line (Line) yields " + said in problem.message, problem
    assert fix in problem.fix, problem.fix


def test_ignored_targets_and_ids_within_the_count_pass() -> None:
    """-100 (what cross-entropy ignores: padding) is no out-of-range id; uint8 ids have no -100."""
    from blocks.runtime.contract import BatchContract

    tokens = BatchContract(TokenBatch(seq_len=3, vocab_size=5))
    tokens.check_batch(_batch(torch.tensor([[0, 1, 4]]), torch.tensor([[1, 4, -100]])))
    tokens.check_batch(_batch(torch.rand(1, 3), torch.tensor([[-100, -100, -100]])))
    classes = BatchContract(FeatureBatch(num_features=2, num_classes=3))
    classes.check_batch(_batch(torch.zeros(3, 2), torch.tensor([0, 1, 2], dtype=torch.uint8)))
