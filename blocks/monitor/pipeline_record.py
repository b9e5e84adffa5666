"""What a pipeline records in its dir, read by the pipeline on a rerun and by ``blocks report`` (torch-free).

``pipeline.json`` holds the stages in order; a stage that takes its model from another records
that stage's result in its ``upstream.json``. :func:`upstream_changes` is the one place that
decides whether a stage's result is still about its upstream's current result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from blocks.spec.errors import BlocksError, Problem

PIPELINE_FILE = "pipeline.json"
"""In a pipeline's dir: its stages in order, ``{"stages": [{"name", "does", "from"}, ...]}`` (written by the pipeline)."""
STAGE_FILE = "stage.json"
"""An evaluation's or export's settings, to tell whether a rerun would do the same."""
UPSTREAM_FILE = "upstream.json"
"""The result of the stage a stage took its model from (step, ``state_digest``), to tell whether it changed since."""
STAGE_KINDS = ("train", "evaluate", "export")


def read_stages(root: Path) -> list[dict[str, Any]]:
    """The stages the pipeline in *root* recorded, in order; a clear error naming what is wrong when the record is not blocks'."""
    file = root / PIPELINE_FILE
    fix = "run the pipeline again (it skips its finished stages and records them anew)"
    try:
        stages = json.loads(file.read_text())["stages"]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        wrong = f"no 'stages' list ({type(exc).__name__}: {exc})"
        raise BlocksError(
            Problem("RUN_DIR", f"{file} is not the record of its stages a pipeline writes: {wrong}", fix)
        ) from None
    if not isinstance(stages, list):
        raise BlocksError(
            Problem(
                "RUN_DIR",
                f"{file} is not the record of its stages a pipeline writes: 'stages' is not a list",
                fix,
            )
        )
    names: list[str] = []
    for number, stage in enumerate(stages, start=1):
        problem = _stage_problem(stage, names)
        if problem:
            raise BlocksError(
                Problem(
                    "RUN_DIR",
                    f"{file} is not the record of its stages a pipeline writes: stage {number} {problem}",
                    fix,
                )
            )
        names.append(stage["name"])
    return list(stages)


def _stage_problem(stage: Any, earlier: list[str]) -> str | None:
    """What is wrong with one stage of ``pipeline.json`` (None: nothing)."""
    if not isinstance(stage, dict):
        return f"is {stage!r}, not an object"
    name = stage.get("name")
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
        return f"has no plain directory name ('name': {name!r})"
    if stage.get("does") not in STAGE_KINDS:
        return f"({name}) has 'does': {stage.get('does')!r}, not one of {', '.join(STAGE_KINDS)}"
    upstream = stage.get("from")
    if upstream is not None and upstream not in earlier:
        return f"({name}) takes its model 'from': {upstream!r}, not an earlier stage"
    return None


def upstream_result(name: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    """Which result the train stage *name* holds, from its ``summary.json`` (*summary*): its step and ``state_digest``."""
    return {
        "stage": name,
        "global_step": summary.get("global_step", 0),
        "state_digest": summary.get("state_digest"),
    }


def upstream_changes(stage_dir: Path, result: Mapping[str, Any]) -> list[str]:
    """How *result* (the upstream's now) differs from the one the stage in *stage_dir* took (empty: the same)."""
    record = stage_dir / UPSTREAM_FILE
    name = result["stage"]
    if not record.is_file():
        return [f"(the stage did not record which result of stage {name} it took)"]
    try:
        before = json.loads(record.read_text())
    except (OSError, ValueError) as exc:
        return [
            f"(the stage's record of which result of stage {name} it took, {record}, is unreadable: {exc})"
        ]
    if not isinstance(before, dict):
        return [f"(the stage's record of which result of stage {name} it took, {record}, is not an object)"]
    if before == result and result["state_digest"]:
        return []
    digests = (str(before.get("state_digest"))[:12], str(result["state_digest"])[:12])
    return [
        f"stage {name}'s result: step {before.get('global_step')} → {result['global_step']}, "
        f"state_digest {digests[0]} → {digests[1]}"
    ]
