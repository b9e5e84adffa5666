"""The files of a run dir (DESIGN.md contract): what the driver writes and workers read back."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from blocks.core.compose import BLOCK_KEY, config_to_blocks
from blocks.core.masking import hide_environment_values
from blocks.core.plan import Plan
from blocks.core.run_files import (  # noqa: F401  (the run-dir contract, re-exported for launch)
    CHECKPOINTS_DIR,
    COMPLETED_SUMMARY_FILE,
    COMPLETED_WEIGHTS_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    PLAN_FILE,
    SUMMARY_FILE,
    WEIGHTS_FILE,
    Status,
    Summary,
    differing_keys,
)
from blocks.core.secrets import env_interpolations, resolve_keeping_env
from blocks.spec.block import Block
from blocks.spec.errors import BlocksError, Problem
from blocks.spec.kinds import KIND_TABLE


def freeze_config(config: DictConfig, run_dir: Path) -> DictConfig:
    """The config as the run will use it: resolved (values from the environment stay ``${oc.env:...}``), with run-dir defaults filled in."""
    frozen = resolve_keeping_env(config)
    if frozen.checkpoint.get("dir", None) is None and "dir" in frozen.checkpoint:
        frozen.checkpoint.dir = str((run_dir / CHECKPOINTS_DIR).resolve())
    return frozen


def write_job_files(run_dir: Path, config: DictConfig, plan: Plan) -> str:
    """Write ``config.yaml`` and ``plan.json``: enough for any worker to rebuild the run. Returns ``config.yaml``'s text.

    Each file is replaced in one rename: the drivers of a multi-node job write the same files
    into the shared run dir, and a worker reads either's whole file, never a mix of two.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    text = OmegaConf.to_yaml(config)
    shown = dataclasses.replace(plan, from_environment=env_interpolations(config))  # what is written decides
    write_atomic(run_dir / CONFIG_FILE, text)
    write_atomic(run_dir / PLAN_FILE, json.dumps(shown.to_json(), indent=2) + "\n")
    return text


def write_atomic(path: Path, text: str) -> None:
    """Write *text* into a temporary file beside *path*, then rename it over *path*."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


DISPLAY_KEYS = (
    "monitor.progress",
    "monitor.loggers",
    "monitor.logger_args",
    "monitor.stall_timeout_s",
    "monitor.rank_spread_tolerance",
    "monitor.grad_spike_factor",
    "monitor.peak_flops",
)
"""Keys that change what a run shows or where it reports, never what it trains.

A rerun of a finished run that changes only these keeps their recorded values
(:func:`refuse_rewriting_finished`). Not among them: ``monitor.log_every_n_steps`` (the health
checks, hence a rollback, run at logged steps, and ``checkpoint.keep_best`` ranks the logged
metrics), ``monitor.grad_norm`` (a metric a checkpoint can be ranked by), ``monitor.objective``
and ``monitor.objective_mode`` (what the job returns to a sweeper), and the health policies.
"""

_MISSING = object()


def changed_keys(run_dir: Path, config: DictConfig) -> list[str]:
    """The keys whose values *config* changes from the run dir's ``config.yaml`` (none when it has none).

    What a version of blocks other than the one that wrote ``config.yaml`` spells differently is
    no change: a block field ``config.yaml`` lacks (written before the field existed) at the
    field's default, a whole block section it lacks (before the kind existed) with the kind's
    default block and every field at its default, and a recorded field or section the
    current blocks no longer have.
    """
    before = recorded_config(run_dir)
    if before is None:
        return []
    after = OmegaConf.to_container(config, resolve=False)
    changed = differing_keys(before, after)
    default = str((run_dir / CHECKPOINTS_DIR).resolve())
    if OmegaConf.select(config, "checkpoint.dir", default=None) == default:  # a moved run dir's own default
        changed = [key for key in changed if key != "checkpoint.dir"]
    if any(_value_at(before, key) is _MISSING or _value_at(after, key) is _MISSING for key in changed):
        blocks = config_to_blocks(config)
        changed = [key for key in changed if not _other_version(blocks, before, after, key)]
    return changed


def _other_version(blocks: Mapping[str, Block], before: dict, after: object, key: str) -> bool:
    """Whether *key* differs only as another version of blocks writes it (see :func:`changed_keys`)."""
    recorded, now = _value_at(before, key), _value_at(after, key)
    if recorded is _MISSING:
        if "." in key:
            return now == _field_default(blocks, key)
        added = next((k for k in KIND_TABLE if k.name == key), None)
        return (
            added is not None
            and isinstance(now, dict)
            and now.get(BLOCK_KEY) == added.default
            and all(
                value == _field_default(blocks, f"{key}.{name}")
                for name, value in now.items()
                if name != BLOCK_KEY
            )
        )
    if now is _MISSING:  # a field or block kind that this version no longer has
        kind, _, name = key.partition(".")
        block = blocks.get(kind)
        if block is None:
            return isinstance(recorded, dict) and BLOCK_KEY in recorded
        return bool(name) and name.split(".", 1)[0] not in {f.name for f in dataclasses.fields(block)}
    return False


def recorded_config(run_dir: Path) -> dict | None:
    """The run dir's ``config.yaml`` as recorded (interpolations unresolved); None when it has none."""
    try:
        recorded = OmegaConf.to_container(OmegaConf.load(run_dir / CONFIG_FILE), resolve=False)
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def _value_at(container: object, key: str) -> object:
    for name in key.split("."):
        if not isinstance(container, dict) or name not in container:
            return _MISSING
        container = container[name]
    return container


def _field_default(blocks: Mapping[str, Block], key: str) -> object:
    """The default of the block field *key* names (``kind.field``); :data:`_MISSING` for any other key."""
    kind, _, name = key.partition(".")
    block = blocks.get(kind)
    if block is None or not name or "." in name:
        return _MISSING
    for f in dataclasses.fields(block):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return _MISSING


def _is_display(key: str) -> bool:
    return any(key == shown or key.startswith(f"{shown}.") for shown in DISPLAY_KEYS)


class FinishedRunKept(BlocksError):
    """A rerun refused so as not to rewrite a finished run's record (:func:`refuse_rewriting_finished`): nothing written."""


def finished_how(steps: int, stopped_at: int) -> str:
    """How a finished run ended, for messages: all its *steps* trained, or stopped early at step *stopped_at*."""
    if stopped_at < steps:
        return f"stopped early at step {stopped_at} of its {steps} steps (a callback stopped it)"
    return f"has trained all its {steps} steps"


def how_to_train_further(config: DictConfig, steps: int, steps_per_epoch: int) -> str:
    """The override that lets a run *config* bounds at *steps* train on: raise the limit(s) that bound it.

    ``trainer.max_epochs`` bounds it when its epochs of *steps_per_epoch* steps end by *steps*,
    ``trainer.max_steps`` when it is at most *steps*; both when both do.
    """
    max_steps = OmegaConf.select(config, "trainer.max_steps")
    max_epochs = OmegaConf.select(config, "trainer.max_epochs")
    raises = []
    if max_epochs and steps_per_epoch and max_epochs * steps_per_epoch <= steps:
        raises.append(f"trainer.max_epochs to {steps // steps_per_epoch + 1}")
    if (max_steps and max_steps <= steps) or not raises:
        raises.append(f"trainer.max_steps above {steps}")
    return "raise " + " and ".join(raises)


def refuse_rewriting_finished(
    run_dir: Path, config: DictConfig, step: int, stopped_at: int | None = None, steps_per_epoch: int = 0
) -> tuple[DictConfig, list[str]]:
    """Refuse a rerun that would train nothing yet record a changed config over a finished run.

    The run dir's checkpoint is at the last of the *step* steps the run was given, or at
    *stopped_at* when a callback (``EarlyStopping``) stopped it early and it gets no more now:
    nothing would be trained, and the weights and metrics would stay those of the settings its ``config.yaml``
    holds now. A rerun that changes only :data:`DISPLAY_KEYS` is not refused: it runs with their
    recorded values, so ``config.yaml`` goes on describing the run that trained. The fix names
    the limit that bounds the run (:func:`how_to_train_further`; *steps_per_epoch* tells whether
    ``trainer.max_epochs`` does). Returns the config the rerun runs with and the display keys set back.
    """
    changed = changed_keys(run_dir, config)
    trained = [key for key in changed if not _is_display(key)]
    if trained:
        shown = ", ".join(trained[:5]) + (f" and {len(trained) - 5} more" if len(trained) > 5 else "")
        how = finished_how(step, step if stopped_at is None else stopped_at)
        raise FinishedRunKept(
            Problem(
                trained[0],
                f"the run in {run_dir} {how}; with {shown} changed nothing would be "
                "trained, and its config.yaml would no longer describe its weights and metrics",
                f"give a new hydra.run.dir to train with the new setting, or "
                f"{how_to_train_further(config, step, steps_per_epoch)} to train on from the checkpoint with it",
                related=tuple(trained[1:]),
            )
        )
    if not changed:
        return config, []
    before = recorded_config(run_dir)
    after = OmegaConf.to_container(config, resolve=False)
    kept = OmegaConf.create(after)
    assert isinstance(kept, DictConfig)
    blocks = config_to_blocks(config)
    for key in changed:
        if _value_at(after, key) is _MISSING:
            continue  # a field this version no longer has: nothing to set back
        value = _value_at(before, key)
        if value is _MISSING:  # an older config.yaml: the run trained as the field's default has it
            value = _field_default(blocks, key)
        if value is _MISSING:
            parent, _, name = key.rpartition(".")
            node = OmegaConf.select(kept, parent)
            del node[name]
        else:
            OmegaConf.update(kept, key, value, merge=False)
    return kept, changed


def retire_summary(run_dir: Path) -> None:
    """Take away the ``summary.json`` an earlier run left in *run_dir*: a new attempt is starting.

    Until this attempt writes its own, nothing claims how it ended (a process killed meanwhile
    leaves none, and the driver writes ``failed``). A completed one is moved to
    :data:`COMPLETED_SUMMARY_FILE` (in one rename), where a rerun that trains no further finds
    its figures (:func:`completed_before`); any other is removed. Its ``model.safetensors`` is
    set aside the same way (:data:`COMPLETED_WEIGHTS_FILE`): the attempt may train past it, and
    until it completes and writes its own, the run's weights are its newest checkpoint.
    """
    path = run_dir / SUMMARY_FILE
    try:
        completed = Summary.read(run_dir).status == "completed"
    except (OSError, ValueError, TypeError):
        completed = False
    if (run_dir / WEIGHTS_FILE).is_file():  # anything else there is no weights file (and its write fails)
        with contextlib.suppress(FileNotFoundError):
            os.replace(run_dir / WEIGHTS_FILE, run_dir / COMPLETED_WEIGHTS_FILE)
    with contextlib.suppress(FileNotFoundError):
        if completed:
            os.replace(path, run_dir / COMPLETED_SUMMARY_FILE)
        else:
            path.unlink()


def completed_before(run_dir: Path) -> Summary | None:
    """The summary of the last completed run in *run_dir* that :func:`retire_summary` set aside, if any."""
    try:
        return Summary.read(run_dir, COMPLETED_SUMMARY_FILE)
    except (OSError, ValueError, TypeError):
        return None


@dataclass(frozen=True)
class FrozenRun:
    """What a run dir holds for its workers: the config as written and the plan rebuilt from it.

    Attributes:
        config: ``config.yaml``, values from the environment still ``${oc.env:...}``.
        plan: its blocks, with everything else from ``plan.json``.
        config_text: ``config.yaml``'s text as read.
    """

    config: DictConfig
    plan: Plan
    config_text: str = ""


def load_run(run_dir: Path) -> FrozenRun:
    """The config and plan the driver froze into *run_dir* (``config.yaml`` read once).

    Nothing is planned again and no hardware is detected: a worker trains with the derived
    numbers and the environment the driver planned against, even when its own machine differs.
    """
    text = (run_dir / CONFIG_FILE).read_text()
    config = OmegaConf.create(text)
    assert isinstance(config, DictConfig)
    plan_file = run_dir / PLAN_FILE
    if not plan_file.exists():
        raise BlocksError(
            Problem(
                "run_dir",
                f"{run_dir} has no {PLAN_FILE}: it was not prepared by blocks run",
                "start the run with blocks run (or blocks.launch.driver.prepare) so the plan is frozen",
            )
        )
    frozen = json.loads(plan_file.read_text())
    from_environment = hide_environment_values(config)
    plan = Plan.thawed(config_to_blocks(config), frozen, from_environment=from_environment)
    return FrozenRun(config=config, plan=plan, config_text=text)


def load_plan(run_dir: Path) -> Plan:
    """The plan the driver froze into *run_dir*: blocks from ``config.yaml``, everything else from ``plan.json``."""
    return load_run(run_dir).plan
