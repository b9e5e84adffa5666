"""Running a pipeline recipe: stage after stage, each in ``<pipeline dir>/<stage>``, skipping finished ones.

A stage is finished when its ``summary.json`` says ``completed`` and its result exists (a
train stage's ``model.safetensors`` or committed checkpoint, an evaluation's ``metrics.json``,
an export's ``model/model.json``). A train stage that was interrupted resumes from its own
checkpoints (``checkpoint.resume=auto``), because its run dir is the same on every run.

A finished stage is skipped only when it would run the same way again: a train stage's
resolved config equals its ``config.yaml``, an evaluation's or export's settings equal its
``stage.json``, and no stage it takes its model from ran again. Otherwise the change is
printed, the finished stage's directory is moved aside (``<stage>.previous-N``) and the
stage runs again from scratch.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from blocks.checkpoint import store
from blocks.core.pipeline import Evaluate, Export, Pipeline, Stage, Train
from blocks.launch.run_dir import CHECKPOINTS_DIR, SUMMARY_FILE, WEIGHTS_FILE, Summary

METRICS_JSON = "metrics.json"
EXPORT_DIR = "model"
STAGE_FILE = "stage.json"
"""An evaluation's or export's settings, to tell whether a rerun would do the same."""


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


def stage_settings(pipeline: Pipeline, stage: Stage, root: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """What a stage would run with: a train stage's resolved config, an evaluation's or export's settings."""
    stage_dir = root / stage.name
    if isinstance(stage, Train):
        from omegaconf import OmegaConf

        from blocks.core.jobs import compose
        from blocks.launch.run_dir import freeze_config

        frozen = freeze_config(compose(train_overrides(pipeline, stage, root, overrides)).config, stage_dir)
        settings = OmegaConf.to_container(frozen)
        assert isinstance(settings, dict)
        return {str(key): value for key, value in settings.items()}
    _, scoped = split_overrides(pipeline, overrides)
    if isinstance(stage, Evaluate):
        return {
            "evaluate": stage.source,
            "overrides": [*stage.overrides, *scoped[stage.name]],
            "split": stage.split,
        }
    return {"export": stage.source}


def finished_settings(stage: Stage, stage_dir: Path) -> dict[str, Any] | None:
    """The settings a finished stage ran with (None when its directory does not record them)."""
    if isinstance(stage, Train):
        from omegaconf import OmegaConf

        config_file = stage_dir / "config.yaml"
        if not config_file.is_file():
            return None
        settings = OmegaConf.to_container(OmegaConf.load(config_file))
        return {str(key): value for key, value in settings.items()} if isinstance(settings, dict) else None
    record = stage_dir / STAGE_FILE
    return json.loads(record.read_text()) if record.is_file() else None


def changes(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """``key: old → new`` for each dotted key that differs between two settings (empty: the same)."""
    if old is None:
        return ["(the finished stage did not record its settings)"]
    before, after = _flatten(old), _flatten(new)
    return [
        f"{key}: {before.get(key, '<unset>')} → {after.get(key, '<unset>')}"
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    ]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _depends_on(stage: Stage) -> str | None:
    return stage.init_from if isinstance(stage, Train) else stage.source


def _move_aside(stage_dir: Path) -> Path:
    """Rename a finished stage's directory to the first free ``<stage>.previous-N``."""
    number = 1
    while (target := stage_dir.with_name(f"{stage_dir.name}.previous-{number}")).exists():
        number += 1
    stage_dir.rename(target)
    return target


def run_pipeline(
    pipeline: Pipeline, root: Path, overrides: Sequence[str] = (), say: Callable[[str], None] = print
) -> dict[str, Summary]:
    """Run every unfinished stage of *pipeline* under *root*; returns each stage's summary."""
    from blocks.launch.driver import run
    from blocks.launch.evaluate import evaluate

    _, scoped = split_overrides(pipeline, overrides)
    summaries: dict[str, Summary] = {}
    ran: set[str] = set()
    for stage in pipeline.stages:
        stage_dir = root / stage.name
        settings = stage_settings(pipeline, stage, root, overrides)
        if is_finished(stage, stage_dir):
            upstream = _depends_on(stage)
            changed = changes(finished_settings(stage, stage_dir), settings)
            if upstream in ran:
                changed.append(f"stage {upstream} ran again")
            if not changed:
                say(f"stage {stage.name}: finished earlier, skipped ({stage_dir})")
                summaries[stage.name] = Summary.read(stage_dir)
                continue
            previous = _move_aside(stage_dir)
            say(f"stage {stage.name}: finished earlier with other settings; running it again")
            for line in changed[:10]:
                say(f"  {line}")
            if len(changed) > 10:
                say(f"  ... and {len(changed) - 10} more")
            say(f"  (the previous results are in {previous})")
        ran.add(stage.name)
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
            from blocks.runtime.model_export import export_model

            shutil.rmtree(stage_dir / EXPORT_DIR, ignore_errors=True)  # an unfinished export's leftovers
            export_model(source, stage_dir / EXPORT_DIR)
            metrics = {}
        (stage_dir / STAGE_FILE).write_text(json.dumps(settings, indent=2) + "\n")
        summary = Summary(status="completed", metrics=metrics)
        summary.write(stage_dir)
        summaries[stage.name] = summary
    return summaries
