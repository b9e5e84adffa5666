"""Real training on one process: every built-in block, run dir files, determinism, failures."""

from __future__ import annotations

import csv
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from blocks.core import jobs
from blocks.launch import driver
from blocks.launch.run_dir import load_plan
from blocks.model.base import ModelBlock
from blocks.model.mlp import MLP
from blocks.runtime.trainer import build_run
from blocks.spec.registry import register

TINY_BLOBS = ["recipe=blobs", "data.samples=512", "monitor.progress=off"]
TINY_LM = ["recipe=tiny_lm", "trainer.max_steps=6", "trainer.val_every=3", "monitor.progress=off"]


def metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_blobs_mlp_classify_learns(tmp_path: Path) -> None:
    summary = driver.run(["recipe=blobs", "monitor.progress=off"], tmp_path)
    assert summary.status == "completed"
    assert summary.metrics["val/accuracy"] > 0.95
    assert summary.global_step == summary.epoch * jobs.plan(["recipe=blobs"]).derived.steps_per_epoch


def test_transformer_lm_loss_falls(tmp_path: Path) -> None:
    summary = driver.run(["recipe=tiny_lm", "monitor.progress=off"], tmp_path)
    rows = [r for r in metrics_rows(tmp_path) if r.get("val/loss")]
    first, last = float(rows[0]["val/loss"]), float(rows[-1]["val/loss"])
    assert summary.status == "completed"
    assert last < first - 0.2, (first, last)
    assert summary.metrics["val/perplexity"] == pytest.approx(math.exp(summary.metrics["val/loss"]), rel=1e-4)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true"])
def test_every_cpu_precision_trains(tmp_path: Path, precision: str) -> None:
    summary = driver.run([*TINY_LM, f"precision={precision}"], tmp_path)
    assert summary.status == "completed"
    assert math.isfinite(summary.metrics["train/loss"])
    assert json.loads((tmp_path / "plan.json").read_text())["blocks"]["precision"]["block"] == precision


@pytest.mark.parametrize(
    "overrides",
    [
        ["optim=sgd", "optim.lr=0.05", "optim.schedule=linear"],
        ["optim=sgd", "optim.nesterov=true", "optim.schedule=constant", "optim.grad_clip=null"],
        ["optim=adamw", "optim.schedule=cosine", "optim.warmup_steps=3"],
        ["model.activation=gelu", "model.dropout=0.1", "task.label_smoothing=0.1"],
        ["data.num_workers=1"],
    ],
)
def test_optimizers_schedules_and_options_train(tmp_path: Path, overrides: list[str]) -> None:
    summary = driver.run([*TINY_BLOBS, "trainer.max_epochs=1", *overrides], tmp_path)
    assert summary.status == "completed"
    assert summary.metrics["val/accuracy"] > 0.5


def warmup_cosine_lr(step: int, *, peak: float, warmup: int, total: int) -> float:
    """The rate of optimizer step *step* (1-based) under linear warmup then cosine decay to 0, written out."""
    if step <= warmup:
        return peak * step / (warmup + 1)
    return peak * 0.5 * (1 + math.cos(math.pi * (step - 1 - warmup) / (total - warmup)))


def test_lr_follows_warmup_then_cosine(tmp_path: Path) -> None:
    """The ``lr`` of step N is the rate the optimizer used for step N, first and last step included."""
    driver.run(
        [
            *TINY_BLOBS,
            "trainer.max_steps=20",
            "trainer.max_epochs=null",
            "optim.warmup_steps=4",
            "optim.lr=0.01",
            "optim.min_lr_ratio=0.0",
            "monitor.log_every_n_steps=1",
        ],
        tmp_path,
    )
    rows = [r for r in metrics_rows(tmp_path) if r.get("lr")]
    assert [int(r["step"]) for r in rows] == list(range(1, 21))
    lrs = [float(r["lr"]) for r in rows]
    expected = [warmup_cosine_lr(step, peak=0.01, warmup=4, total=20) for step in range(1, 21)]
    assert lrs == pytest.approx(expected, rel=1e-5)  # metrics.csv keeps 6 significant digits
    assert lrs[:5] == pytest.approx([0.002, 0.004, 0.006, 0.008, 0.01])  # warmup, then the peak
    assert lrs[-1] > 0.0, "the last step decays towards 0 but does not train at it"
    assert all(a >= b for a, b in itertools.pairwise(lrs[4:]))


def test_char_level_text_from_files(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    (corpus / "b.txt").write_text("pack my box with five dozen liquor jugs. " * 200)
    summary = driver.run([*TINY_LM, f"data.path={corpus}/*.txt", "data.level=char"], tmp_path / "run")
    assert summary.status == "completed"
    plan = load_plan(tmp_path / "run")
    assert plan.data.batch_spec().vocab_size == len(
        set((corpus / "a.txt").read_text() + (corpus / "b.txt").read_text() + "\n")
    )


def test_run_dir_holds_the_contract_files(tmp_path: Path) -> None:
    summary = driver.run([*TINY_BLOBS, "trainer.max_epochs=1", "monitor.log_every_n_steps=2"], tmp_path)
    for name in ("config.yaml", "plan.json", "metrics.csv", "summary.json"):
        assert (tmp_path / name).is_file(), name
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[0] == "step"
    for column in ("train/loss", "lr", "grad_norm", "samples_per_s", "val/loss", "val/accuracy"):
        assert column in header
    data = json.loads((tmp_path / "summary.json").read_text())
    assert set(data) >= {
        "status",
        "reason",
        "global_step",
        "epoch",
        "world_size",
        "restarts",
        "resumed_from",
        "metrics",
        "samples_per_s",
        "wall_s",
        "state_digest",
    }
    assert data["status"] == "completed" and data["reason"] is None and data["world_size"] == 1
    assert data["samples_per_s"] > 0 and data["wall_s"] > 0 and len(data["state_digest"]) == 64
    config = OmegaConf.load(tmp_path / "config.yaml")
    assert config.checkpoint.dir == str((tmp_path / "checkpoints").resolve())
    assert load_plan(tmp_path).blocks == jobs.plan_config(
        jobs.compose([*TINY_BLOBS, "trainer.max_epochs=1", "monitor.log_every_n_steps=2"])
    ).blocks | {"checkpoint": load_plan(tmp_path).checkpoint}
    assert summary.state_digest == data["state_digest"]


def test_same_seed_same_digest_other_seed_other_digest(tmp_path: Path) -> None:
    args = [*TINY_LM, "model.dropout=0.1"]
    first = driver.run(args, tmp_path / "a")
    second = driver.run(args, tmp_path / "b")
    third = driver.run([*args, "trainer.seed=1"], tmp_path / "c")
    assert first.state_digest == second.state_digest
    assert first.state_digest != third.state_digest


def final_weights(overrides: list[str], run_dir: Path) -> dict[str, torch.Tensor]:
    plan = jobs.plan(overrides)
    built = build_run(plan, run_dir, console=False)
    built.trainer.fit(built.module, datamodule=built.datamodule)
    return {k: v.detach().clone() for k, v in built.module.model.state_dict().items()}


def test_accumulation_trains_on_the_same_global_batches(tmp_path: Path) -> None:
    """Batch 16 and batch 8 × accumulate 2 see the same samples per step and reach the same weights."""
    common = [*TINY_BLOBS, "trainer.max_steps=12", "trainer.max_epochs=null", "optim=sgd", "optim.lr=0.05"]
    whole = final_weights([*common, "data.batch_size=16"], tmp_path / "a")
    accumulated = final_weights([*common, "data.batch_size=8", "optim.accumulate=2"], tmp_path / "b")
    quartered = final_weights([*common, "data.batch_size=4", "optim.accumulate=4"], tmp_path / "c")
    for name, tensor in whole.items():
        torch.testing.assert_close(accumulated[name], tensor, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(quartered[name], tensor, rtol=1e-5, atol=1e-6)


@register("exploding")
@dataclass(frozen=True, kw_only=True)
class Exploding(MLP):
    """An MLP whose forward pass fails after a few calls (to test failure handling)."""

    fail_after: int = 3

    def build(self, spec):  # type: ignore[no-untyped-def]
        network = super().build(spec)
        calls = {"n": 0}
        fail_after = self.fail_after

        def forward_hook(module, args):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            if calls["n"] > fail_after:
                raise RuntimeError("the model exploded on purpose")

        network.register_forward_pre_hook(forward_hook)
        return network


def test_a_failing_run_writes_a_failed_summary(tmp_path: Path) -> None:
    from blocks.core import catalog

    catalog.register_configs()  # make the block registered above a config option
    assert isinstance(Exploding(), ModelBlock)
    with pytest.raises(RuntimeError, match="exploded on purpose"):
        driver.run([*TINY_BLOBS, "model=exploding"], tmp_path)
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["status"] == "failed"
    assert "exploded on purpose" in data["reason"]
    assert data["global_step"] == 3


def test_a_block_only_this_program_registers_is_refused_before_worker_processes_start(tmp_path: Path) -> None:
    """Regression: the plan passed, torchrun started, and every worker failed with "no model block
    named 'exploding'" and the fix "model=<one of ...>": workers load only blocks' own blocks,
    packages and the project's recipes, not the module of the program that launched them."""
    from blocks.core import catalog
    from blocks.spec.errors import ConfigError

    catalog.register_configs()
    with pytest.raises(ConfigError) as refused:  # restarts go through torchrun, even for one process
        driver.run([*TINY_BLOBS, "model=exploding", "trainer.max_failures=1"], tmp_path)
    (problem,) = refused.value.problems
    assert problem.key == "model" and "model block 'exploding' (" in problem.message
    assert "test_train:Exploding) is registered by this program only" in problem.message
    assert "put the block in a recipes dir ([tool.blocks] recipes, --recipes, BLOCKS_PATH)" in problem.fix
    assert not (tmp_path / "config.yaml").exists(), "refused before the run dir was written"
