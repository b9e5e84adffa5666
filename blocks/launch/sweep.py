"""Expanding a command line's sweep overrides into one override list per job (before launching any)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from blocks.compat.hydra_private import hydra_config_loader, split_sweep
from blocks.core import catalog, paths
from blocks.core.compose import GROUPS, group_options
from blocks.core.overrides import syntax_problems
from blocks.spec.errors import ConfigError, Problem

if TYPE_CHECKING:
    from blocks.core.plan import Plan

_GROUP_GLOB = re.compile(r"^([+~]?)([\w/]+)=glob\((.*)\)$")


def expand_group_globs(args: Sequence[str]) -> list[str]:
    """*args* with each group glob (``model=glob(acme/*)``) replaced by the list of options it matches.

    Hydra's own ``glob`` only sees a group's top-level options, so it misses namespaced ones
    (``acme/resnet``); the glob is expanded here against every option, nested ones included.
    Other arguments pass through unchanged.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob
    from hydra.errors import HydraException

    out = []
    for arg in args:
        match = _GROUP_GLOB.match(arg)
        if not match or match.group(2) not in GROUPS:
            out.append(arg)
            continue
        prefix, group, _ = match.groups()
        try:
            (override,) = OverridesParser.create().parse_overrides([arg])
        except HydraException as exc:
            raise ConfigError(
                Problem(group, str(exc).splitlines()[0], f"{group}=glob(acme/*) or {group}=glob(*,exclude=x)")
            ) from None
        assert isinstance(override.value(), Glob)
        options = override.value().filter(group_options(group))  # type: ignore[union-attr]
        if not options:
            raise ConfigError(
                Problem(
                    group,
                    f"{arg.split('=', 1)[1]} matches no option of group '{group}'",
                    f"options: {', '.join(group_options(group))}",
                )
            )
        out.append(f"{prefix}{group}={','.join(options)}")
    return out


def expand_sweep(overrides: Sequence[str]) -> list[list[str]]:
    """Every job's overrides, as Hydra's basic sweeper would launch them (``a=1,2 b=x,y`` → 4 jobs).

    Group globs (``model=glob(*)``) expand against the registered options and the YAML presets.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    catalog.load()
    overrides = expand_group_globs(overrides)
    conf = paths.conf_dir()
    loader = hydra_config_loader([("blocks", f"file://{conf}")] if conf is not None else [])
    parser = OverridesParser.create(config_loader=loader)
    malformed = syntax_problems(overrides)
    if malformed:
        raise ConfigError(malformed)
    try:
        parsed = parser.parse_overrides(list(overrides))
        searched = [o for o in parsed if o.is_interval_sweep()]
        if searched:
            raise ConfigError([_interval_problem(o) for o in searched])
        batches = split_sweep(parsed)
    except HydraException as exc:
        raise ConfigError(
            Problem("", str(exc).splitlines()[0], "check the sweep syntax, e.g. optim.lr=1e-3,3e-4")
        ) from None
    return [list(job) for batch in batches for job in batch]


def _interval_problem(override: Any) -> Problem:
    """``key=interval(lo,hi)`` under the basic sweeper, which runs listed values and cannot sample a range."""
    key = override.get_key_element().lstrip("+~")
    return Problem(
        key,
        f"{str(override.input_line).split('=', 1)[1]} is a range to search, but the basic sweeper only runs "
        "listed values",
        f"let Optuna search it: add hparams_search=optuna (pip install 'blocks[optuna]'), or list "
        f"values: {key}=0.1,0.2",
    )


def shared_checkpoint_dirs(jobs: Sequence[tuple[Sequence[str], Plan]]) -> list[Problem]:
    """A problem for each ``checkpoint.dir`` that several jobs of one sweep would write to.

    Each job resumes from the newest checkpoint in its directory: sharing one, a later trial
    would continue (or finish as) an earlier one, whatever its own settings. A job whose
    directory is unset keeps its checkpoints in its own run dir.
    """
    by_dir: dict[str, list[Sequence[str]]] = {}
    for overrides, plan in jobs:
        block = plan.checkpoint
        if block.enabled and block.dir:
            by_dir.setdefault(block.dir, []).append(overrides)
    return [
        Problem(
            "checkpoint.dir",
            f"{len(sharing)} jobs of the sweep would keep their checkpoints in {directory} and resume "
            f"from each other's ([{' '.join(sharing[0])}] and [{' '.join(sharing[1])}])",
            "leave checkpoint.dir unset (each job then keeps its checkpoints in its own run dir), or "
            "make it differ per job, e.g. checkpoint.dir=<dir>/lr${optim.lr}",
            check="sweep-checkpoint-dir",
        )
        for directory, sharing in by_dir.items()
        if len(sharing) > 1
    ]


FAILED_JOBS: list[Path] = []
"""The job dirs of the last sweep that did not complete (set when the sweep ends)."""


def failed_jobs(sweep_dir: Path) -> list[Path]:
    """The job dirs under *sweep_dir* whose ``summary.json`` says anything but ``completed``."""
    failed = []
    for path in sorted(sweep_dir.rglob("summary.json")):
        try:
            status = json.loads(path.read_text()).get("status")
        except (OSError, ValueError):
            status = None
        if status != "completed":
            failed.append(path.parent)
    return failed


class SweepOutcome(Callback):
    """A Hydra callback: when a sweep ends, name its failed jobs so ``blocks run -m`` can exit non-zero."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Collect the failed jobs of the sweep dir into :data:`FAILED_JOBS` and say which they are."""
        FAILED_JOBS[:] = failed_jobs(Path(str(config.hydra.sweep.dir)))
        if FAILED_JOBS:
            names = ", ".join(str(p) for p in FAILED_JOBS)
            print(
                f"blocks: {len(FAILED_JOBS)} job(s) of the sweep did not complete: {names} "
                "(their summary.json says why; blocks report SWEEP_DIR ranks every job)",
                file=sys.stderr,
            )
