"""The run-dir file contract (DESIGN.md): file names and ``summary.json``, shared by build and launch.

Below both layers so that the trainer (build) and the driver (launch) write and read the same
files without importing each other.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from blocks.core.masking import hidden

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
CHECKPOINTS_DIR = "checkpoints"
WEIGHTS_FILE = "model.safetensors"
COMPLETED_SUMMARY_FILE = ".completed-summary.json"
"""The ``summary.json`` of the run dir's last completed run, set aside when another attempt starts.

An attempt removes ``summary.json`` before it writes anything else, so a reader never takes an
earlier outcome for this attempt's; a rerun that trains no further keeps that run's figures.
"""

COMPLETED_WEIGHTS_FILE = ".completed-model.safetensors"
"""The ``model.safetensors`` of the run dir's last completed run, set aside with its summary.

A new attempt trains on from a checkpoint that may be newer, so the old file no longer stands
for the run's weights (``blocks eval``/``export`` and ``init_from`` would read it); an attempt
that completes writes its own and removes this one.
"""

Status = Literal["completed", "failed", "interrupted"]


def config_digest(text: str) -> str:
    """The sha256 of a ``config.yaml``'s text: what the driver wrote and a worker read are the same config when these agree."""
    return hashlib.sha256(text.encode()).hexdigest()


_ABSENT = object()


def differing_keys(before: object, after: object, key: str = "") -> list[str]:
    """The dotted keys whose values differ between two configs as plain containers (a key one lacks included)."""
    if isinstance(before, dict) and isinstance(after, dict):
        names = [*before, *(name for name in after if name not in before)]
        return [
            k
            for name in names
            for k in differing_keys(
                before.get(name, _ABSENT), after.get(name, _ABSENT), f"{key}.{name}".lstrip(".")
            )
        ]
    return [] if before == after else [key]


@dataclass
class Summary:
    """``summary.json``: how a run ended (written at the end, also on failure).

    Attributes:
        status: completed, failed or interrupted.
        reason: why it failed or was interrupted; for a completed run, why it stopped before
            ``total_steps`` (an EarlyStopping callback), else null.
        global_step: optimizer steps taken.
        epoch: full passes over the training split completed.
        world_size: processes that trained.
        restarts: times the job was restarted after a failure.
        resumed_from: checkpoint URL the run resumed from, or null.
        metrics: the last value of every metric by name (``train/loss``, ``val/loss``, ...).
        samples_per_s: training samples per second over the whole run, warm-up, validation and
            checkpoint stalls included (total samples / training seconds): for a failed or
            interrupted run up to where it stopped, for a resumed run over every attempt (each up
            to the checkpoint the next one resumed).
        steady_samples_per_s: training samples per second in the steady state: every logged
            window after the first (warm-up), without the time spent in validation and checkpoint
            saves; null when fewer than two windows were logged.
        steady_tokens_per_s: the same in tokens per second (token data only, else null).
        wall_s: seconds from the start of this attempt's worker to its end (a resumed run:
            this attempt only).
        state_digest: sha256 of the final weights (see ``blocks.runtime.digest``).
        checkpoint_stall_s: seconds training waited for checkpoint saves (with
            ``checkpoint.async_save``, only for the copies to host memory).
        tokens_per_s: ``samples_per_s`` in tokens per second (token data only, else null).
        train_s: seconds of training behind ``samples_per_s``: the whole run, every attempt.
    """

    status: Status
    reason: str | None = None
    global_step: int = 0
    epoch: int = 0
    world_size: int = 1
    restarts: int = 0
    resumed_from: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    samples_per_s: float = 0.0
    steady_samples_per_s: float | None = None
    steady_tokens_per_s: float | None = None
    wall_s: float = 0.0
    state_digest: str | None = None
    checkpoint_stall_s: float = 0.0
    tokens_per_s: float | None = None
    train_s: float = 0.0

    def write(self, run_dir: Path) -> None:
        """Write ``summary.json`` atomically (a reader never sees half a file), secrets hidden in its texts."""
        path = run_dir / SUMMARY_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.shown(), indent=2) + "\n")
        tmp.replace(path)

    def shown(self) -> dict[str, Any]:
        """The fields as a dict, secrets hidden in the texts people read (reason, resumed_from)."""
        data = asdict(self)
        for text in ("reason", "resumed_from"):
            if isinstance(data[text], str):
                data[text] = hidden(data[text])
        return data

    @classmethod
    def read(cls, run_dir: Path, name: str = SUMMARY_FILE) -> Summary:
        """Read a run dir's ``summary.json`` (or another file of the same form, *name*).

        Fields are only ever added to ``summary.json``: the keys a later version of blocks wrote
        that this one does not know are left out, so a run dir outlives a downgrade.
        """
        data: dict[str, Any] = json.loads((run_dir / name).read_text())
        known = {field.name for field in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})
