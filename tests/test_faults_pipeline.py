"""A pipeline rerun skips a finished stage only when it would run the same way again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blocks.core import catalog
from blocks.core.recipe import RECIPES
from blocks.launch.pipeline import run_pipeline
from tests.conftest import read_summary

pytestmark = pytest.mark.timeout(900)

PRETRAIN = ["pretrain.trainer.max_steps=10", "monitor.progress=off"]
ARGS = [*PRETRAIN, "finetune.trainer.max_steps=10"]


def run(root: Path, overrides: list[str]) -> str:
    catalog.load()
    pipeline = RECIPES.get("digits_pipeline").pipeline()
    assert pipeline is not None
    said: list[str] = []
    run_pipeline(pipeline, root, overrides, say=said.append)
    return "\n".join(said)


def skipped(stage: str, said: str) -> bool:
    return f"stage {stage}: finished earlier, skipped" in said


def test_a_rerun_skips_only_the_stages_that_would_run_the_same(tmp_path: Path) -> None:
    root = tmp_path / "pipe"
    run(root, ARGS)

    said = run(root, ARGS)
    assert all(skipped(stage, said) for stage in ("pretrain", "finetune", "evaluate", "export")), said

    said = run(root, [*ARGS, "evaluate.data.batch_size=7"])
    assert skipped("finetune", said) and skipped("export", said)
    assert "stage evaluate: finished earlier with other settings; running it again" in said

    said = run(root, [*PRETRAIN, "finetune.trainer.max_steps=12", "finetune.optim.lr=1e-4"])
    assert skipped("pretrain", said)
    assert "stage finetune: finished earlier with other settings; running it again" in said
    assert "trainer.max_steps: 10 → 12" in said
    assert "optim.lr:" in said and "→ 0.0001" in said
    finetune = read_summary(root / "finetune")
    assert finetune["global_step"] == 12
    assert not finetune.get("resumed_from"), "a changed stage starts from scratch"
    assert (root / "finetune.previous-1" / "summary.json").is_file(), "the previous results are kept"
    assert not skipped("evaluate", said) and not skipped("export", said)
    assert "stage finetune ran again" in said
    metrics = json.loads((root / "evaluate" / "metrics.json").read_text())
    assert metrics["val/accuracy"] == pytest.approx(finetune["metrics"]["val/accuracy"], abs=1e-6)
