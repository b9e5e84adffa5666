"""A pipeline rerun skips a finished stage only when it would run the same way again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blocks.core import catalog
from blocks.core.pipeline import Evaluate, Pipeline
from blocks.core.recipe import RECIPES
from blocks.launch.pipeline import StageProblems, run_pipeline
from tests.conftest import read_summary

pytestmark = pytest.mark.timeout(900)

PRETRAIN = ["pretrain.trainer.max_steps=10", "monitor.progress=off"]
ARGS = [*PRETRAIN, "finetune.trainer.max_steps=10"]


def digits_pipeline() -> Pipeline:
    catalog.load()
    pipeline = RECIPES.get("digits_pipeline").pipeline()
    assert pipeline is not None
    return pipeline


def run(root: Path, overrides: list[str], pipeline: Pipeline | None = None) -> str:
    pipeline = pipeline or digits_pipeline()
    said: list[str] = []
    run_pipeline(pipeline, root, overrides, say=said.append)
    return "\n".join(said)


def skipped(stage: str, said: str) -> bool:
    return f"stage {stage}: finished earlier, skipped" in said


def report_rows(cli_in_process, root: Path) -> dict[str, list[str]]:
    """``blocks report`` of the pipeline dir *root*: its table's cells by stage."""
    result = cli_in_process("report", str(root))
    assert result.returncode == 0, result.output
    lines = (root / "report" / "report.md").read_text().splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("| ")]
    return {row[0]: row for row in rows[1:]}


def same_weights(a: Path, b: Path) -> bool:
    return (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_a_rerun_skips_only_the_stages_that_would_run_the_same(tmp_path: Path, cli_in_process) -> None:
    root = tmp_path / "pipe"
    run(root, ARGS)

    # An evaluation's bad setting is refused before any stage starts: finetune is neither retrained nor moved.
    bad = ["finetune.trainer.max_steps=12", "evaluate.data.batch_size=0"]
    result = cli_in_process("run", "recipe=digits_pipeline", f"hydra.run.dir={root}", *PRETRAIN, *bad)
    assert result.returncode == 2, result.output
    assert "stage 'evaluate' of recipe=digits_pipeline has problems; nothing was started" in result.output
    assert "data.batch_size" in result.output and "stage finetune: running" not in result.output
    assert read_summary(root / "finetune")["global_step"] == 10
    assert not list(root.glob("*.previous-*"))

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

    # Regression: an evaluation of a split the data has no samples in failed at its stage, after
    # finetune had trained again; it is refused before any stage starts.
    pipeline = digits_pipeline()
    test_split = Evaluate("evaluate", source="finetune", split="test")
    broken = Pipeline(stages=(*pipeline.stages[:2], test_split, *pipeline.stages[3:]))
    tuned = [*PRETRAIN, "finetune.trainer.max_steps=14", "finetune.optim.lr=1e-4"]
    moved = sorted(root.glob("*.previous-*"))
    with pytest.raises(StageProblems, match="no test split") as refused:
        run(root, tuned, broken)
    (problem,) = refused.value.problems
    assert refused.value.stage == "evaluate" and not refused.value.started
    assert (problem.key, problem.check) == ("split", "eval-split-samples") and "split='val'" in problem.fix
    assert read_summary(root / "finetune")["global_step"] == 12 and sorted(root.glob("*.previous-*")) == moved

    # finetune retrains, then the evaluation fails at its stage (finetune's config.yaml turns
    # unreadable in between, which only running the stage finds): export is not reached.
    config = root / "finetune" / "config.yaml"
    written: list[str] = []

    def spoil_the_source(line: str) -> None:
        if line.startswith("stage evaluate: running"):
            written.append(config.read_text())
            config.write_text("[not yaml")

    with pytest.raises(StageProblems, match="is not a config blocks wrote") as failed:
        run_pipeline(pipeline, root, tuned, say=spoil_the_source)
    config.write_text(written[0])
    assert failed.value.stage == "evaluate" and failed.value.started
    assert sorted(root.glob("*.previous-*")) == [*moved, root / "finetune.previous-2"], (
        "no finished result moved"
    )
    assert (root / "evaluate" / "metrics.json").is_file()
    # Regression: blocks report showed the evaluation and export of finetune's step 12 as results of its step 14.
    rows = report_rows(cli_in_process, root)
    assert rows["finetune"][2:4] == ["completed", "14"], rows
    assert rows["evaluate"][2] == rows["export"][2] == "outdated (finetune ran again)", rows
    assert rows["evaluate"][4].endswith("(of an earlier result of finetune)"), rows
    said = run(root, tuned)
    assert skipped("finetune", said) and not skipped("evaluate", said) and not skipped("export", said)
    assert "stage finetune's result: step 12 → 14" in said
    assert same_weights(root / "export" / "model", root / "finetune")

    # pretrain retrains, and the process ends before finetune starts: finetune is not left on the old weights.
    retrained = ["pretrain.trainer.max_steps=12", *tuned[1:]]
    record = root / "pipeline.json"
    recorded, inode = record.read_text(), record.stat().st_ino
    run(root, retrained[:2], Pipeline(stages=pipeline.stages[:1]))
    assert record.stat().st_ino != inode, "the record is replaced whole, never rewritten in place"
    record.write_text(recorded)  # as the whole pipeline recorded it before it stopped after pretrain
    rows = report_rows(cli_in_process, root)
    assert rows["finetune"][2] == "outdated (pretrain ran again)", rows
    assert rows["evaluate"][2] == rows["export"][2] == "outdated (finetune is outdated)", rows
    said = run(root, retrained)
    assert "stage finetune: finished earlier with other settings; running it again" in said
    assert "stage pretrain's result: step 10 → 12" in said
    assert same_weights(root / "export" / "model", root / "finetune")
    assert not same_weights(root / "finetune", root / "finetune.previous-3")

    # A stage recorded before upstream results were (no upstream.json) runs again rather than trusted.
    (root / "export" / "upstream.json").unlink()
    said = run(root, retrained)
    assert skipped("evaluate", said) and not skipped("export", said)
    assert "did not record which result of stage finetune it took" in said

    # Regression: blocks report took the pipeline dir for a sweep and ranked its stages (and the
    # stages moved aside) as jobs; it reports the stages in order.
    result = cli_in_process("report", str(root))
    assert result.returncode == 0, result.output
    report = (root / "report" / "report.md").read_text()
    assert "Pipeline report: pipe (4 stages)" in report, report
    rows = [line.split("|")[1].strip() for line in report.splitlines() if line.startswith("| ")][1:]
    assert [row for row in rows if not set(row) <= {"-", ":"}] == [
        "pretrain",
        "finetune",
        "evaluate",
        "export",
    ]
    assert "| train (from pretrain) | completed | 14 |" in report and "previous" not in report, report
    assert "outdated" not in report, report
    (root / "pipeline.json").unlink()  # a pipeline dir written before the stages were recorded
    result = cli_in_process("report", str(root))
    assert result.returncode == 2 and "is a pipeline's dir" in result.output, result.output
