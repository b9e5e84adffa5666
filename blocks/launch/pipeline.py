"""Running a pipeline recipe: stage after stage, each in ``<pipeline dir>/<stage>``, skipping finished ones.

A stage is finished when its ``summary.json`` says ``completed`` and its result exists (a
train stage's ``model.safetensors`` or committed checkpoint, an evaluation's ``metrics.json``,
an export's ``model/model.json``). A train stage that was interrupted resumes from its own
checkpoints (``checkpoint.resume=auto``), because its run dir is the same on every run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from blocks.checkpoint import store
from blocks.core.pipeline import Evaluate, Export, Pipeline, Stage, Train
from blocks.launch.run_dir import CHECKPOINTS_DIR, SUMMARY_FILE, WEIGHTS_FILE, Summary

METRICS_JSON = "metrics.json"
EXPORT_DIR = "model"


def split_overrides(pipeline: Pipeline, overrides: Sequence[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Command-line overrides for every train stage, and those prefixed ``STAGE.`` for one stage only."""
    names = {stage.name for stage in pipeline.stages}
    shared: list[str] = []
    scoped: dict[str, list[str]] = {name: [] for name in names}
    for override in overrides:
        head, dot, rest = override.lstrip("+~").partition(".")
        if dot and head in names:
            prefix = override[: len(override) - len(override.lstrip("+~"))]
            scoped[head].append(prefix + rest)
        else:
            shared.append(override)
    return shared, scoped


def train_overrides(pipeline: Pipeline, stage: Train, root: Path, overrides: Sequence[str]) -> list[str]:
    """The Hydra overrides of a train stage: its own, its ``init_from`` stage's dir, then the command line's."""
    shared, scoped = split_overrides(pipeline, overrides)
    out = list(stage.overrides)
    if stage.init_from:
        out.append(f"model.init_from={(root / stage.init_from).resolve()}")
    return [*out, *shared, *scoped[stage.name]]


def is_finished(stage: Stage, stage_dir: Path) -> bool:
    """Whether *stage* completed and its result is in *stage_dir*."""
    summary = stage_dir / SUMMARY_FILE
    if not summary.is_file() or Summary.read(stage_dir).status != "completed":
        return False
    if isinstance(stage, Train):
        return (stage_dir / WEIGHTS_FILE).is_file() or store.newest_valid(
            str(stage_dir / CHECKPOINTS_DIR)
        ) is not None
    if isinstance(stage, Evaluate):
        return (stage_dir / METRICS_JSON).is_file()
    return (stage_dir / EXPORT_DIR / "model.json").is_file()


def run_pipeline(
    pipeline: Pipeline, root: Path, overrides: Sequence[str] = (), say: Callable[[str], None] = print
) -> dict[str, Summary]:
    """Run every unfinished stage of *pipeline* under *root*; returns each stage's summary."""
    from blocks.launch.driver import run
    from blocks.launch.evaluate import evaluate

    _, scoped = split_overrides(pipeline, overrides)
    summaries: dict[str, Summary] = {}
    for stage in pipeline.stages:
        stage_dir = root / stage.name
        if is_finished(stage, stage_dir):
            say(f"stage {stage.name}: finished earlier, skipped ({stage_dir})")
            summaries[stage.name] = Summary.read(stage_dir)
            continue
        say(f"stage {stage.name}: running in {stage_dir}")
        if isinstance(stage, Train):
            summaries[stage.name] = run(train_overrides(pipeline, stage, root, overrides), stage_dir)
            continue
        source = str((root / stage.source).resolve())
        stage_dir.mkdir(parents=True, exist_ok=True)
        if isinstance(stage, Evaluate):
            metrics = evaluate(source, [*stage.overrides, *scoped[stage.name]], split=stage.split)
            (stage_dir / METRICS_JSON).write_text(json.dumps(metrics, indent=2) + "\n")
            say("  " + "  ".join(f"{name}={value:.4g}" for name, value in metrics.items()))
        else:
            assert isinstance(stage, Export)
            from blocks.checkpoint.model_export import export_model

            export_model(source, stage_dir / EXPORT_DIR)
            metrics = {}
        summary = Summary(status="completed", metrics=metrics)
        summary.write(stage_dir)
        summaries[stage.name] = summary
    return summaries
