"""The conformance kit (blocks.testing) on every built-in block, and the fixes it asks for on bad ones."""

from __future__ import annotations

import enum
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from blocks import register
from blocks.core import catalog, jobs
from blocks.data import FeatureBatch
from blocks.model import MLP, ModelBlock
from blocks.spec.registry import REGISTRY
from blocks.testing import (
    ConformanceError,
    check_config_round_trip,
    check_ddp,
    check_listing,
    check_plan,
    check_training,
    host,
)
from blocks.testing.plugin import blocks_kit  # noqa: F401 - the plugin's fixture, as pytest11 would load it
from tests.catalog_fixtures import fresh_catalog
from tests.conftest import run_in_process

catalog.load()
BUILTINS = [
    (e.kind, e.name) for e in fresh_catalog().registry.entries()
]  # blocks' own, none a test module added
ADAPTER_OVERRIDES = {
    ("model", "torch_module"): [
        "model.target=tests.legacy_team.TinyNet",
        "model.spec_args={in_features:num_features,num_classes:num_classes}",
    ],
    ("data", "stream"): ["data.source=python:email", "data.tokenizer=byte", "data.seq_len=32"],
    ("data", "lightning_data"): [
        "data.target=tests.legacy_team.ClustersDM",
        "data.num_features=8",
        "data.num_classes=3",
        "data.train_samples=192",
        "data.val_samples=64",
        "data.batch_size=16",
        "data.kwargs={batch_size:16}",
    ],
}
NEEDS_GPU = {("precision", "16-mixed")}
ON_CHARLM = {
    ("data", "text"),
    ("data", "stream"),
    ("model", "transformer"),
    ("task", "lm"),
    ("strategy", "fsdp"),
}
"""The built-ins that ``recipe=charlm`` hosts: a 4-layer transformer on batches of 32 sequences of 128
tokens (~0.5 s a step on one CPU thread) and a 10-batch validation at the last step of each run."""
LIGHTER_CHARLM = ["data.batch_size=8", "trainer.limit_val_batches=1"]
"""What :func:`trained_once` adds for :data:`ON_CHARLM`: a quarter of the batch and one validation batch
(~4x less work). The check compares the straight and the resumed run's training losses and weights,
which neither setting touches."""
DDP_JOBS = {
    "model=transformer,data=text,optim=sgd,strategy=ddp": (
        "model",
        "transformer",
        ["data=text", "optim=sgd"],
    ),
}
"""Built-ins trained under DDP, as many per 2-process job as fit in one: a job's start costs ~10 s
of CPU (a driver, torchrun and a forkserver importing Lightning), the two training steps almost
nothing. The MLP is the blobs recipe's model, which conftest's ``ddp_blobs_run`` and
test_distributed's DDP jobs train on two processes."""


@pytest.fixture(autouse=True)
def allow_legacy_team(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests.legacy_team")


def test_every_built_in_kind_is_covered() -> None:
    assert {kind for kind, _ in BUILTINS} == {e.kind for e in REGISTRY.entries()}
    assert len(BUILTINS) >= 18


@pytest.mark.parametrize(("kind", "name"), BUILTINS, ids=[f"{k}={n}" for k, n in BUILTINS])
def test_built_in_config_plan_and_listing(kind: str, name: str) -> None:
    overrides = ADAPTER_OVERRIDES.get((kind, name), [])
    check_config_round_trip(kind, name, overrides)
    if (kind, name) in NEEDS_GPU:
        with pytest.raises(ConformanceError, match="needs a gpu"):
            check_plan(kind, name, overrides)
    else:
        plan = check_plan(kind, name, overrides)
        assert plan.blocks[kind].block_name == name
    assert name in check_listing(kind, name)


def trained_once(kind: str, name: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``check_training`` of ``kind=name``, run once per composed configuration in this pytest session.

    Several built-ins are their minimal recipe's own default (``optim=adamw`` in ``recipe=blobs``
    composes exactly ``recipe=blobs``), so their checks train the same configuration: the first
    test to reach it trains and records the summary, the others (on any xdist worker: the
    directory is shared and locked) read it.
    """
    overrides = [
        *ADAPTER_OVERRIDES.get((kind, name), []),
        *(LIGHTER_CHARLM if (kind, name) in ON_CHARLM else []),
    ]
    composed = OmegaConf.to_yaml(jobs.compose(host(kind, name, overrides).overrides).config)
    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    workdir = root / "conformance-training" / hashlib.sha256(composed.encode()).hexdigest()[:16]
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        recorded = workdir / "summary.json"
        if recorded.exists():
            return json.loads(recorded.read_text())
        summary = check_training(kind, name, workdir, overrides, in_process=True)
        recorded.write_text(json.dumps(summary))
        return summary


@pytest.mark.slow
@pytest.mark.timeout(1200)  # may wait for another worker's training of the same configuration
@pytest.mark.parametrize(
    ("kind", "name"),
    [b for b in BUILTINS if b not in NEEDS_GPU],
    ids=[f"{k}={n}" for k, n in BUILTINS if (k, n) not in NEEDS_GPU],
)
def test_built_in_trains_and_resumes_from_its_checkpoint(
    kind: str, name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    summary = trained_once(kind, name, tmp_path_factory)
    assert summary["global_step"] == 4 and summary["resumed_from"]


@pytest.mark.slow
@pytest.mark.parametrize("trained", sorted(DDP_JOBS))
def test_built_ins_train_under_ddp(trained: str, tmp_path: Path) -> None:
    kind, name, others = DDP_JOBS[trained]
    assert check_ddp(kind, name, tmp_path, [*others, *LIGHTER_CHARLM])["world_size"] == 2  # on recipe=charlm
    plan = json.loads((tmp_path / f"ddp-{kind}-{name}" / "plan.json").read_text())
    chosen = dict(choice.split("=") for choice in trained.split(","))
    assert {k: plan["blocks"][k]["block"] for k in chosen} == chosen


@dataclass(frozen=True, kw_only=True)
class Doubling(MLP):
    """Doubles its dropout after construction, so a config read back is not the same block.

    Attributes:
        hidden: widths.
        activation: activation.
        dropout: dropout.
    """

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(2 * h for h in self.hidden))


@dataclass(frozen=True, kw_only=True)
class Undocumented(MLP):
    """Forgets to document its own field."""

    extra: int = 1


@dataclass(frozen=True, kw_only=True)
class Picky(ModelBlock):
    """Accepts no standard batch.

    Attributes:
        width: width.
    """

    accepts = (FeatureBatch,)
    width: int = 2

    def num_parameters(self, spec) -> int:  # type: ignore[no-untyped-def]
        return 0

    def check(self, ctx) -> None:  # type: ignore[no-untyped-def]
        ctx.error("width", "refuses every composition", "there is none")


@dataclass(frozen=True, kw_only=True)
class Unbuildable(MLP):
    """Plans like an MLP; its build raises, as a block with a missing kernel would.

    Attributes:
        hidden: widths.
        activation: activation.
        dropout: dropout.
    """

    def build(self, spec):  # type: ignore[no-untyped-def]
        raise RuntimeError("the vendored kernels are missing")


@dataclass(frozen=True, kw_only=True)
class Leaky(MLP):
    """An MLP whose output scale, halved every training step, is a buffer its checkpoint does not hold.

    Attributes:
        hidden: widths.
        activation: activation.
        dropout: dropout.
    """

    def build(self, spec):  # type: ignore[no-untyped-def]
        import torch

        class Scaled(torch.nn.Module):
            def __init__(self, inner: torch.nn.Module) -> None:
                super().__init__()
                self.inner = inner
                self.register_buffer("scale", torch.ones(1), persistent=False)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if self.training:
                    self.scale.mul_(0.5)
                return self.inner(x) * self.scale

        return Scaled(super().build(spec))


@pytest.fixture(scope="module")
def bad_blocks() -> None:
    bad = (
        (Doubling, "doubling"),
        (Undocumented, "undocumented"),
        (Picky, "picky"),
        (Unbuildable, "unbuildable"),
        (Leaky, "leaky"),
    )
    with REGISTRY.namespace("kitbad", "kit-bad-blocks", "0.0.1"):
        for cls, name in bad:
            register(name)(cls)
    catalog.register_configs()


def test_failures_say_what_the_block_must_fix(bad_blocks: None) -> None:
    with pytest.raises(ConformanceError, match=r"changes when read back from YAML.*Do not transform fields"):
        check_config_round_trip("model", "kitbad/doubling")
    with pytest.raises(
        ConformanceError, match=r"does not document extra: add them to the 'Attributes:' section"
    ):
        check_listing("model", "kitbad/undocumented")
    with pytest.raises(ConformanceError, match=r"plans in none of the minimal recipes") as info:
        check_plan("model", "kitbad/picky")
    assert "recipe=blobs" in str(info.value) and "refuses every composition" in str(info.value)
    with pytest.raises(ConformanceError, match=r"is not registered.*@register"):
        check_plan("model", "kitbad/missing")


def test_a_block_that_fails_to_train_in_process_is_named_with_its_error(
    bad_blocks: None, tmp_path: Path
) -> None:
    """In-process training checks a block registered by the test module itself, and reports its traceback."""
    with pytest.raises(ConformanceError, match=r"did not complete \(exit 1") as info:
        check_training("model", "kitbad/unbuildable", tmp_path, in_process=True)
    assert "RuntimeError: the vendored kernels are missing" in str(info.value)
    assert "build() must make objects that train" in str(info.value)
    assert os.getcwd() != str(tmp_path), "the working directory is given back"


def test_a_block_that_does_not_resume_exactly_is_named_with_the_step_it_differs_at(
    bad_blocks: None, tmp_path: Path
) -> None:
    """A run resumed halfway must train as the same run uninterrupted; the kit names the first step that does not."""
    check_config_round_trip("model", "kitbad/leaky")
    check_plan("model", "kitbad/leaky")
    with pytest.raises(ConformanceError, match=r"at step 3 train/loss is \S+ resumed, \S+ straight") as info:
        check_training("model", "kitbad/leaky", tmp_path, in_process=True)
    assert "persistent=False" in str(info.value)
    want, got = (info.value.args[0].split("train/loss is ")[1].split(" straight")[0]).split(" resumed, ")
    assert float(want) != float(got)


def test_the_fixture_binds_the_kit_to_a_directory(blocks_kit, tmp_path: Path) -> None:  # noqa: F811
    assert blocks_kit.workdir == tmp_path
    assert blocks_kit.check_plan("optim", "sgd").blocks["optim"].block_name == "sgd"


@pytest.mark.parametrize("ini", ["", "blocks_kit_in_process = true"])
def test_the_ini_option_makes_the_fixture_train_in_process(ini: str, pytester: pytest.Pytester) -> None:
    """A package's pytest configuration chooses in-process training for the ``blocks_kit`` fixture."""
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(f"def test_kit(blocks_kit):\n    assert blocks_kit.in_process is {bool(ini)}\n")
    pytester.runpytest_inprocess().assert_outcomes(passed=1)


class Shade(enum.Enum):
    """A config enum (OmegaConf holds it; config.yaml records its name)."""

    LIGHT = 1
    DARK = 2


@dataclass(frozen=True, kw_only=True)
class OddTyped(MLP):
    """An MLP with an Enum and a path field, types OmegaConf supports.

    Attributes:
        hidden: widths.
        activation: activation.
        dropout: dropout.
        shade: an enum.
        where: a path.
    """

    shade: Shade = Shade.DARK
    where: Path = Path("/srv/data")


def test_enum_and_path_fields_plan_list_train_and_resume_as_their_names(tmp_path: Path) -> None:
    """Plan and list JSON, plan.json and config.yaml write an Enum by its name and a path as text; a rerun rebuilds it."""
    with REGISTRY.namespace("kitodd", "kit-odd-blocks", "0.0.1"):
        register("typed")(OddTyped)
    catalog.register_configs()
    chosen = ["recipe=blobs", "model=kitodd/typed", "model.shade=LIGHT"]
    planned = run_in_process(["plan", *chosen, "--json"], cwd=tmp_path)
    assert planned.returncode == 0, planned.stdout
    shown = json.loads(planned.stdout)["blocks"]["model"]["fields"]
    assert (shown["shade"], shown["where"]) == ("LIGHT", "/srv/data")
    listed = run_in_process(["list", "model", "--json"], cwd=tmp_path)
    assert listed.returncode == 0, listed.stdout
    entry = next(e for e in json.loads(listed.stdout) if e["name"] == "kitodd/typed")
    assert {f["name"]: f["default"] for f in entry["fields"]}["shade"] == "DARK"
    check_listing("model", "kitodd/typed")

    run_dir = tmp_path / "run"
    few = [*chosen, "data.samples=256", "monitor.progress=off", "checkpoint.every_n_steps=2"]
    first = run_in_process(["run", *few, "trainer.max_steps=2", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout
    assert json.loads((run_dir / "plan.json").read_text())["blocks"]["model"]["fields"]["shade"] == "LIGHT"
    assert "shade: LIGHT" in (run_dir / "config.yaml").read_text()
    extended = run_in_process(["run", *few, "trainer.max_steps=3", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert extended.returncode == 0, extended.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["global_step"], summary["resumed_from"]) == (
        3,
        str(run_dir / "checkpoints" / "step-000000002"),
    )
    changed = run_in_process(
        ["run", *few, "model.shade=DARK", "trainer.max_steps=4", f"hydra.run.dir={run_dir}"], cwd=tmp_path
    )
    assert changed.returncode == 2 and 'model.shade "LIGHT" -> "DARK"' in changed.stdout, changed.stdout
