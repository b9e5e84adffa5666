"""Running a pipeline recipe: stage after stage, each in ``<pipeline dir>/<stage>``, skipping finished ones.

A stage is finished when its ``summary.json`` says ``completed`` and its result exists (a
train stage's ``model.safetensors`` or committed checkpoint, an evaluation's ``metrics.json``,
an export's ``model/model.json``). A train stage that was interrupted resumes from its own
checkpoints (``checkpoint.resume=auto``), because its run dir is the same on every run.

A finished stage is skipped only when it would run the same way again: a train stage's
resolved config equals its ``config.yaml``, an evaluation's or export's settings equal its
``stage.json``, and the stage it takes its model from holds the result recorded in its
``upstream.json`` (step and ``state_digest``). Otherwise the change is printed, the finished
stage's directory is moved aside (``<stage>.previous-N``) and the stage runs again from
scratch; so does an interrupted stage that started from another upstream result.

Every evaluation's settings are checked against its source's config before the first stage
runs, as the CLI plans every train stage first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from blocks.checkpoint import store
from blocks.core.pipeline import Evaluate, Pipeline, Stage, Train
from blocks.launch.collector import collect_earlier_jobs
from blocks.launch.run_dir import CHECKPOINTS_DIR, SUMMARY_FILE, WEIGHTS_FILE, Summary, write_atomic
from blocks.monitor.pipeline_record import (
    PIPELINE_FILE,
    STAGE_FILE,
    UPSTREAM_FILE,
    upstream_changes,
    upstream_result,
)
from blocks.spec.errors import BlocksError, TrainingError

METRICS_JSON = "metrics.json"
EXPORT_DIR = "model"


class StageProblems(BlocksError):
    """A stage's settings have problems; *started*: whether the pipeline had run a stage (or moved one aside) first."""

    def __init__(self, stage: str, error: BlocksError, *, started: bool) -> None:
        super().__init__(error.problems)
        self.stage = stage
        self.started = started

    def header(self, recipe: str) -> str:
        """The line above the problems: what ran and what did not."""
        if not self.started:
            return f"blocks: stage '{self.stage}' of recipe={recipe} has problems; nothing was started"
        return (
            f"blocks: stage '{self.stage}' of recipe={recipe} has problems; it stopped the pipeline "
            "(the stages before it finished and are kept)"
        )


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


def check_evaluations(pipeline: Pipeline, settings: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse an evaluation whose settings would not run on its source's config (in *settings*), before any stage runs."""
    from omegaconf import OmegaConf

    from blocks.launch.evaluate import eval_plan

    for stage in pipeline.stages:
        if isinstance(stage, Evaluate):
            trained = OmegaConf.create(dict(settings[stage.source]))
            try:
                eval_plan(trained, settings[stage.name]["overrides"], stage.split, split_key="split")
            except BlocksError as exc:
                raise StageProblems(stage.name, exc, started=False) from None


@contextlib.contextmanager
def _stage_of(root: Path) -> Iterator[None]:
    """Inside, a train stage (its processes too) knows it is one of the pipeline in *root*: a signal's advice names that dir."""
    from blocks.launch.worker import PIPELINE_DIR_ENV

    before = os.environ.get(PIPELINE_DIR_ENV)
    os.environ[PIPELINE_DIR_ENV] = str(root)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PIPELINE_DIR_ENV, None)
        else:
            os.environ[PIPELINE_DIR_ENV] = before


def stage_record(stage: Stage) -> dict[str, Any]:
    """What the pipeline dir's :data:`PIPELINE_FILE` (read by ``blocks report``) says of *stage*: its name, what it does, and the stage it takes its model from."""
    does = "train" if isinstance(stage, Train) else "evaluate" if isinstance(stage, Evaluate) else "export"
    return {"name": stage.name, "does": does, "from": _depends_on(stage)}


def _record(stage_dir: Path, name: str, value: Mapping[str, Any]) -> None:
    """Write one of the pipeline's records atomically: a reader (a rerun, ``blocks report``) never sees half of it."""
    write_atomic(stage_dir / name, json.dumps(value, indent=2) + "\n")


def run_pipeline(
    pipeline: Pipeline, root: Path, overrides: Sequence[str] = (), say: Callable[[str], None] = print
) -> dict[str, Summary]:
    """Run every unfinished stage of *pipeline* under *root*; returns each stage's summary.

    Every stage's settings are checked first; :class:`StageProblems` says which stage has problems
    and whether any stage had started. A finished stage is moved aside only once its replacement
    passed its own checks (a train stage's plan; an evaluation or export that succeeded).
    """
    settings = {stage.name: stage_settings(pipeline, stage, root, overrides) for stage in pipeline.stages}
    check_evaluations(pipeline, settings)
    root.mkdir(parents=True, exist_ok=True)
    _record(root, PIPELINE_FILE, {"stages": [stage_record(stage) for stage in pipeline.stages]})
    summaries: dict[str, Summary] = {}
    ran: list[str] = []
    for stage in pipeline.stages:
        stage_dir = root / stage.name
        upstream = _depends_on(stage)
        result = upstream_result(upstream, Summary.read(root / upstream).shown()) if upstream else None
        changed: list[str] = []
        if is_finished(stage, stage_dir):
            changed = changes(finished_settings(stage, stage_dir), settings[stage.name])
            if upstream in ran:
                changed.append(f"stage {upstream} ran again")
            elif result is not None:
                changed += upstream_changes(stage_dir, result)
            if not changed:
                say(f"stage {stage.name}: finished earlier, skipped ({stage_dir})")
                summaries[stage.name] = Summary.read(stage_dir)
                continue
            say(f"stage {stage.name}: finished earlier with other settings; running it again")
        elif result is not None and (stage_dir / UPSTREAM_FILE).is_file():
            changed = upstream_changes(stage_dir, result)
            if changed:
                say(f"stage {stage.name}: started earlier from another result; running it again from scratch")
        for line in changed[:10]:
            say(f"  {line}")
        if len(changed) > 10:
            say(f"  ... and {len(changed) - 10} more")
        say(f"stage {stage.name}: running in {stage_dir}")
        try:
            summaries[stage.name] = _run_stage(
                pipeline, stage, root, overrides, settings[stage.name], result, bool(changed), say
            )
        except TrainingError:
            raise
        except BlocksError as exc:
            moved = isinstance(stage, Train) and bool(changed)  # an evaluation or export moves only once done
            raise StageProblems(stage.name, exc, started=bool(ran) or moved) from None
        ran.append(stage.name)
    return summaries


def _run_stage(
    pipeline: Pipeline,
    stage: Stage,
    root: Path,
    overrides: Sequence[str],
    settings: Mapping[str, Any],
    upstream: Mapping[str, Any] | None,
    replace: bool,
    say: Callable[[str], None],
) -> Summary:
    """Run one stage into its dir; with *replace*, first move the dir there aside (once the new result is made, for an evaluation or export)."""
    from blocks.launch.driver import run
    from blocks.launch.evaluate import evaluate

    stage_dir = root / stage.name

    def make_room() -> None:
        if replace and stage_dir.exists():
            say(f"  (the previous results are in {_move_aside(stage_dir)})")
        stage_dir.mkdir(parents=True, exist_ok=True)

    if isinstance(stage, Train):
        make_room()
        if upstream is not None:
            _record(stage_dir, UPSTREAM_FILE, upstream)
        collect_earlier_jobs()
        with _stage_of(root):
            return run(train_overrides(pipeline, stage, root, overrides), stage_dir)
    source = str((root / stage.source).resolve())
    metrics: dict[str, float] = {}
    if isinstance(stage, Evaluate):
        metrics = evaluate(source, settings["overrides"], split=stage.split)
        make_room()
        _record(stage_dir, METRICS_JSON, metrics)
        say("  " + "  ".join(f"{name}={value:.4g}" for name, value in metrics.items()))
    else:
        from blocks.runtime.model_export import export_model

        partial = stage_dir.with_name(f"{stage.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        export_model(source, partial / EXPORT_DIR)
        make_room()
        shutil.rmtree(stage_dir / EXPORT_DIR, ignore_errors=True)
        (partial / EXPORT_DIR).rename(stage_dir / EXPORT_DIR)
        partial.rmdir()
    _record(stage_dir, STAGE_FILE, settings)
    if upstream is not None:
        _record(stage_dir, UPSTREAM_FILE, upstream)
    summary = Summary(status="completed", metrics=metrics)
    summary.write(stage_dir)
    return summary
