"""Expanding a command line's sweep overrides into one override list per job (before launching any)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write

from blocks.compat.hydra_private import hydra_config_loader, hydra_config_set, split_sweep
from blocks.core import catalog, paths
from blocks.core.compose import GROUPS, group_options
from blocks.core.overrides import syntax_problems
from blocks.core.run_files import CONFIG_FILE, PLAN_FILE, SUMMARY_FILE
from blocks.core.secrets import env_interpolations
from blocks.spec.errors import BlocksError, ConfigError, Problem

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


def shared_checkpoint_dirs(
    jobs: Sequence[tuple[Sequence[str], Plan]], *, searched: Sequence[str] = ()
) -> list[Problem]:
    """A problem for each ``checkpoint.dir`` that several jobs of one sweep would write to.

    Each job resumes from the newest checkpoint in its directory: sharing one, a later trial
    would continue (or finish as) an earlier one, whatever its own settings. A job whose
    directory is unset keeps its checkpoints in its own run dir. Local paths are compared
    once normalized (``a`` and ``b/../a`` are one directory), URLs without a trailing slash.
    For a search, *jobs* are two trials apart in every key it searches (*searched*): a
    directory they share is the one every trial would use.
    """
    dirs = [
        (normalized_dir(plan.checkpoint.dir), overrides)
        for overrides, plan in jobs
        if plan.checkpoint.enabled and plan.checkpoint.dir
    ]
    if searched:
        what = "every trial of the search would keep its checkpoints in {directory} and resume from another's"
        example = "-".join(_short(key) + "${" + _interpolated(key) + "}" for key in searched)
        fix = (
            "leave checkpoint.dir unset (each trial then keeps its checkpoints in its own run dir), or make "
            f"it name every key the search varies ({', '.join(searched)}), e.g. checkpoint.dir=<dir>/{example}"
        )
    else:
        what = "{count} jobs of the sweep would keep their checkpoints in {directory} and resume from each other's"
        fix = (
            "leave checkpoint.dir unset (each job then keeps its checkpoints in its own run dir), or "
            "make it differ per job, naming every key the sweep varies, e.g. checkpoint.dir=<dir>/lr${optim.lr}"
        )
    return [
        Problem(
            "checkpoint.dir",
            what.format(count=len(sharing), directory=directory)
            + f" ([{' '.join(sharing[0])}] and [{' '.join(sharing[1])}])",
            fix,
            check="sweep-checkpoint-dir",
        )
        for directory, sharing in _shared(dirs)
    ]


def normalized_dir(directory: str) -> str:
    """*directory* as the one place it names: a local path absolute and normalized, a URL (``s3://b/x/``) without a trailing slash."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", directory):
        return directory.rstrip("/") or directory
    return os.path.normpath(os.path.abspath(directory))


def _interpolated(key: str) -> str:
    """What names *key*'s value in an interpolation: a config group's choice (``model``) is ``hydra:runtime.choices.model``."""
    return key if "." in key else f"hydra:runtime.choices.{key}"


def _short(key: str) -> str:
    """The last part of a dotted *key* (``optim.lr`` → ``lr``), to name it in a directory."""
    return key.rsplit(".", 1)[-1].rsplit("/", 1)[-1]


def mixed_objectives(jobs: Sequence[tuple[Sequence[str], Plan]]) -> list[Problem]:
    """A problem when a validation objective ranks some jobs of a sweep and ``train/loss`` others.

    A job without a validation split returns ``train/loss`` for a minimized validation
    objective (the plan's ``objective-validation`` warning): a sweep that varies the split
    (``data.val_fraction=0,0.1``) would rank a training loss against validation scores.
    """
    without = [overrides for overrides, plan in jobs if _falls_back(plan)]
    scored = [
        overrides
        for overrides, plan in jobs
        if plan.monitor.objective.startswith("val/") and not _falls_back(plan)
    ]
    if not without or not scored:
        return []
    objective = next(plan.monitor.objective for _, plan in jobs if _falls_back(plan))
    return [
        Problem(
            "monitor.objective",
            f"{len(without)} job(s) of the sweep have no validation split ([{' '.join(without[0])}]) and "
            f"would return train/loss, ranked against the {objective} of the others "
            f"([{' '.join(scored[0])}])",
            "give every job a validation split (e.g. data.val_fraction=0.1), or rank them all by "
            "monitor.objective=train/loss",
            check="sweep-objective",
            related=("data",),
        )
    ]


def _falls_back(plan: Plan) -> bool:
    """Whether *plan*'s job would return ``train/loss`` for its validation objective (it has no validation split)."""
    # A warning only: maximized, it is an error and the job falls back to nothing.
    return any(p.check == "objective-validation" for p in plan.warnings)


def shared_run_dirs(jobs: Sequence[tuple[Sequence[str], DictConfig]]) -> list[Problem]:
    """A problem for each run dir several jobs of one sweep would share.

    *jobs* are each job's overrides and Hydra's config of it, in launch order (the job
    number). A job's run dir is ``hydra.sweep.dir``/``hydra.sweep.subdir`` as Hydra's launcher
    resolves them (``${hydra.job.num}``, ``${hydra.job.override_dirname}``, any key of the job):
    sharing one, a later job would resume an earlier one's checkpoints and report its result.
    """
    dirs = [(job_run_dir(config, num), overrides) for num, (overrides, config) in enumerate(jobs)]
    return [
        Problem(
            "hydra.sweep.subdir",
            f"{len(sharing)} jobs of the sweep would run in {directory} and resume from each other's "
            f"checkpoints ([{' '.join(sharing[0])}] and [{' '.join(sharing[1])}])",
            "give each job a run dir of its own: leave hydra.sweep.subdir unset, or make it name the job, "
            "e.g. hydra.sweep.subdir=${hydra.job.num}",
            check="sweep-run-dir",
        )
        for directory, sharing in _shared(dirs)
    ]


def _shared(dirs: Sequence[tuple[str | None, Sequence[str]]]) -> list[tuple[str, list[Sequence[str]]]]:
    """Each directory (None and empty left out) that several jobs name, with the overrides of those jobs."""
    by_dir: dict[str, list[Sequence[str]]] = {}
    for directory, overrides in dirs:
        if directory:
            by_dir.setdefault(directory, []).append(overrides)
    return [(directory, sharing) for directory, sharing in by_dir.items() if len(sharing) > 1]


def job_run_dir(config: DictConfig, num: int) -> str | None:
    """The absolute run dir of job *num* of a sweep, given Hydra's composed *config* of the job (None: unresolvable)."""
    config = copy.deepcopy(config)
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.job.num = num
        config.hydra.job.id = f"{config.hydra.job.name}_{num}"
    try:
        with hydra_config_set(config):  # ${hydra:...} resolves as in the job
            sweep_dir = str(OmegaConf.select(config, "hydra.sweep.dir"))
            subdir = str(OmegaConf.select(config, "hydra.sweep.subdir"))
    except (
        Exception
    ):  # a subdir naming what only the launcher knows: each job checks its run dir as it starts
        return None
    return os.path.abspath(os.path.join(sweep_dir, subdir))


def swept_keys(config: DictConfig) -> tuple[str, ...]:
    """The keys a sweep varies between its jobs, from Hydra's config of the sweep (``multirun.yaml``).

    Those the command line sweeps (``optim.lr=0.1,0.01``, ``optim=glob(*)``, Optuna's
    ``interval(...)``) and those ``hydra.sweeper.params`` searches. Hydra's own keys are left out.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    keys: set[str] = set()
    # unresolved: an override's value may interpolate a key of the job (or read the environment)
    task = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    try:
        parsed = OverridesParser.create().parse_overrides([str(o) for o in task or ()])
    except HydraException:
        parsed = []
    keys.update(o.key_or_group for o in parsed if o.is_sweep_override())
    params = OmegaConf.select(config, "hydra.sweeper.params")
    searched = OmegaConf.to_container(params, resolve=False) if isinstance(params, DictConfig) else None
    if isinstance(searched, dict):
        keys.update(_flat_keys(searched))
    return tuple(sorted(k for k in keys if k != "hydra" and not k.startswith(("hydra.", "hydra/"))))


def _flat_keys(node: dict[Any, Any], prefix: str = "") -> list[str]:
    """The dotted keys of the leaves of *node* (``{"optim": {"lr": ...}}`` → ``optim.lr``)."""
    keys = []
    for key, value in node.items():
        name = f"{prefix}{key}"
        keys += _flat_keys(value, f"{name}.") if isinstance(value, dict) else [name]
    return keys


SWEEP_JOB_FILE = ".sweep-job.json"
"""In a sweep job's run dir: the sweep that ran the job there, its number, and the values that identify it."""


class RunDirTaken(BlocksError):
    """A sweep job's run dir holds another job (of an earlier sweep, or of this one): refused, nothing written."""


@dataclass(frozen=True)
class SweepJob:
    """A job of a running sweep, as its driver sees it.

    Attributes:
        sweep: what tells this invocation of the sweep from any other (random).
        num: the job's number in the sweep (``hydra.job.num``).
        swept: the keys the sweep varies (:func:`swept_keys`): their values identify the job.
    """

    sweep: str
    num: int
    swept: tuple[str, ...]

    def claim(self, run_dir: Path, config: DictConfig, choices: dict[str, str]) -> dict[str, Any]:
        """The job's identity in *run_dir*, once nothing there belongs to another job; raises :class:`RunDirTaken`.

        A run dir with a ``config.yaml`` holds a job already: this one's own earlier attempt
        when it has the values of every key that identifies either of them (those its sweep
        varies and those the earlier one's did), whatever else changed (a longer
        ``trainer.max_steps``). Another job of this very sweep there means two jobs share
        one ``hydra.sweep.subdir``.
        """
        if not (run_dir / CONFIG_FILE).exists():
            return {key: job_value(config, choices, key) for key in self.swept}
        before = _read_json(run_dir / SWEEP_JOB_FILE)
        if before.get("sweep") == self.sweep and before.get("job") != self.num:
            raise RunDirTaken(
                Problem(
                    "hydra.sweep.subdir",
                    f"jobs {before.get('job')} and {self.num} of this sweep both run in {run_dir}: the later "
                    "would resume the earlier's checkpoints and replace its files",
                    "give each job a run dir of its own: leave hydra.sweep.subdir unset, or make it name "
                    "the job, e.g. hydra.sweep.subdir=${hydra.job.num}",
                    check="sweep-run-dir",
                )
            )
        recorded = before.get("identity")
        earlier = dict(recorded) if isinstance(recorded, dict) else {}
        keys = sorted({*self.swept, *earlier})
        missing = [key for key in keys if key not in earlier]
        if missing:  # a key the earlier sweep did not vary: its value as that job ran
            old_config, old_choices = _job_files(run_dir)
            earlier |= {key: job_value(old_config, old_choices, key) for key in missing}
        identity = {key: job_value(config, choices, key) for key in keys}
        differing = [key for key in keys if earlier[key] != identity[key]]
        if differing:
            values = ", ".join(f"{key}={earlier[key]} there, {identity[key]} here" for key in differing)
            raise RunDirTaken(
                Problem(
                    "hydra.sweep.dir",
                    f"{run_dir} holds another job, of an earlier sweep into this sweep dir ({values}): "
                    "this job would resume its checkpoints and replace its files; nothing was written",
                    "sweep into a new hydra.sweep.dir, or run the earlier sweep's command again to resume "
                    "its jobs",
                )
            )
        return identity

    def record(self, run_dir: Path, identity: dict[str, Any]) -> None:
        """Write :data:`SWEEP_JOB_FILE`: *run_dir* holds this job of this sweep, identified by *identity*."""
        record = {"sweep": self.sweep, "job": self.num, "identity": identity}
        (run_dir / SWEEP_JOB_FILE).write_text(json.dumps(record, indent=2) + "\n")


def job_value(config: DictConfig, choices: dict[str, str], key: str) -> Any:
    """The value of *key* in a job: the option chosen for a group (``optim``), else the config's (plain data, None when absent).

    A value read from the environment (``${oc.env:VAR}``, or an interpolation that passes one
    on) is its interpolation text, as ``config.yaml`` keeps it: :data:`SWEEP_JOB_FILE` records
    these values in the run dir.
    """
    if key in choices:
        return choices[key]
    parent_key, _, name = key.replace("[", ".").replace("]", "").rpartition(".")
    parent = OmegaConf.select(config, parent_key, default=None) if parent_key else config
    if isinstance(parent, (DictConfig, ListConfig)) and OmegaConf.is_interpolation(
        parent, int(name) if isinstance(parent, ListConfig) and name.isdigit() else name
    ):  # looked at before it is resolved, which would read the environment
        dotted = f"{parent_key}.{name}" if parent_key else name
        for path, raw in env_interpolations(config).items():
            if ".".join(map(str, path)) == dotted:
                return raw
    value = OmegaConf.select(config, key, default=None, throw_on_missing=False)
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=False)  # values from the environment stay ${oc.env:...}
    return value


def _job_files(run_dir: Path) -> tuple[DictConfig, dict[str, str]]:
    """The config and the choices a run dir's job ran with (empty when unreadable)."""
    try:
        config = OmegaConf.load(run_dir / CONFIG_FILE)
    except Exception:
        config = OmegaConf.create()
    choices = _read_json(run_dir / PLAN_FILE).get("choices")
    return (
        config if isinstance(config, DictConfig) else OmegaConf.create(),
        {str(k): str(v) for k, v in choices.items()} if isinstance(choices, dict) else {},
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class JobOutcome:
    """How one job of a sweep ended: its number, run dir, and status (``completed``, ``failed``, ``interrupted``, :data:`REFUSED`).

    ``sweep_dir`` is the job's own ``hydra.sweep.dir`` as its job resolved it (absolute; empty
    when unknown): a sweep dir that names the recipe differs between the jobs of a sweep over
    recipes, and a nested ``hydra.sweep.subdir`` (``lr/${optim.lr}``) puts the run dir deeper
    than one level below it.
    """

    num: int
    run_dir: str
    status: str
    sweep_dir: str = ""


REFUSED = "refused"
"""The outcome of a job refused before it wrote anything (its run dir holds another job, or a finished run it would not change)."""

_CURRENT: list[SweepJob] = []
"""The sweep job this process runs now (set when Hydra starts it, see :meth:`SweepOutcome.on_job_start`)."""

_ENDED: list[JobOutcome] = []
"""How the driver says this process's current sweep job ended, for :meth:`SweepOutcome.on_job_end`."""


def current_job() -> SweepJob | None:
    """The sweep job this process runs now (None outside a sweep)."""
    return _CURRENT[-1] if _CURRENT else None


_LOST: list[JobOutcome] = []
"""Jobs whose process died before Hydra's ``on_job_end`` could run there, as the sweep's launcher reported them."""


def job_lost(num: int, run_dir: Path, sweep_dir: str = "") -> None:
    """A launcher's word, in the sweep's process, on job *num* whose process died before it could report (a Ray task killed)."""
    _LOST.append(JobOutcome(num, str(run_dir), "failed", os.path.abspath(sweep_dir) if sweep_dir else ""))


def job_ended(run_dir: Path, status: str) -> None:
    """The driver's word on how the current sweep job ended (nothing outside a sweep)."""
    job = current_job()
    if job is not None:
        _ENDED[:] = [JobOutcome(job.num, str(run_dir), status)]


FAILED_JOBS: list[Path] = []
"""The job dirs of the last sweep that did not complete (set when the sweep ends)."""


class SweepOutcome(Callback):
    """A Hydra callback: follows a sweep's own jobs, so ``blocks run -m`` names those that failed and exits non-zero.

    Hydra calls it in the sweep's process (``on_multirun_*``) and in each job's process
    (``on_job_*``: the sweep's own under the basic launcher; joblib's, submitit's or a Ray
    task's otherwise, each with a copy made when the sweep started). A job in the sweep's
    process hands its outcome over in memory; one elsewhere writes it into a directory of this
    sweep's own under the sweep dir, read and removed when the sweep ends. Nothing else in the
    sweep dir counts: an earlier sweep's jobs there, or jobs of this one elsewhere (a sweep dir
    that interpolates the recipe) are told apart.
    """

    def __init__(self) -> None:
        self.sweep = ""
        self.swept: tuple[str, ...] = ()
        self.records = ""
        self.pid = 0
        self.outcomes: list[JobOutcome] = []

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Name this sweep, note the keys it varies and where jobs in other processes report."""
        self.sweep = uuid.uuid4().hex
        self.swept = swept_keys(config)
        self.records = str(Path(str(config.hydra.sweep.dir)).resolve() / f".blocks-sweep-{self.sweep}")
        self.pid = os.getpid()
        self.outcomes = []
        _LOST.clear()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Tell the job's driver which sweep job it runs (:func:`current_job`)."""
        _ENDED.clear()
        _CURRENT[:] = [SweepJob(self.sweep, int(config.hydra.job.num), self.swept)] if self.sweep else []

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        """Keep the job's outcome (in memory here, in a file from another process)."""
        job = current_job()
        _CURRENT.clear()
        if not self.sweep or job is None:
            return
        run_dir = Path(str(config.hydra.runtime.output_dir))
        outcome = _ENDED.pop() if _ENDED else JobOutcome(job.num, str(run_dir), _summary_status(run_dir))
        outcome = replace(outcome, sweep_dir=_job_sweep_dir(config))
        if os.getpid() == self.pid:
            self.outcomes.append(outcome)
            return
        records = Path(self.records)
        records.mkdir(parents=True, exist_ok=True)
        (records / f"{outcome.num}-{uuid.uuid4().hex}.json").write_text(json.dumps(asdict(outcome)))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Collect the sweep's failed jobs into :data:`FAILED_JOBS` and say which they are."""
        outcomes = [*self.outcomes, *_LOST]
        _LOST.clear()
        records = Path(self.records) if self.records else None
        if records is not None and records.is_dir():
            for path in records.glob("*.json"):
                data = _read_json(path)
                if {"num", "run_dir", "status"} <= data.keys():
                    outcomes.append(
                        JobOutcome(
                            int(data["num"]),
                            str(data["run_dir"]),
                            str(data["status"]),
                            str(data.get("sweep_dir") or ""),
                        )
                    )
            shutil.rmtree(records, ignore_errors=True)
        outcomes.sort(key=lambda o: o.num)
        say_where_the_jobs_went(outcomes, str(config.hydra.sweep.dir))
        failed = [o for o in outcomes if o.status != "completed"]
        FAILED_JOBS[:] = [Path(o.run_dir) for o in failed]
        if FAILED_JOBS:
            names = ", ".join(
                o.run_dir
                + (" (refused before it started: its files are as they were)" if o.status == REFUSED else "")
                for o in failed
            )
            print(
                f"blocks: {len(FAILED_JOBS)} job(s) of the sweep did not complete: {names} "
                "(their summary.json says why; blocks report SWEEP_DIR ranks every job)",
                file=sys.stderr,
            )


def say_where_the_jobs_went(outcomes: list[JobOutcome], sweep_dir: str) -> None:
    """Print the sweep dir(s) the jobs of *outcomes* ran in, and where ``multirun.yaml`` went when elsewhere.

    Hydra writes ``multirun.yaml`` into *sweep_dir* as the sweep's own config resolves it; a
    sweep over recipes under the default ``multirun/<recipe>/...`` puts each job under its own
    recipe's dir instead. A job's sweep dir is the one it resolved itself (``JobOutcome.sweep_dir``),
    else *sweep_dir*, each when its run dir lies inside (a ``hydra.sweep.subdir`` of several
    levels puts it deeper than one), else its run dir's parent.
    """
    dirs = list(dict.fromkeys(_outcome_sweep_dir(o, sweep_dir) for o in outcomes))
    if not dirs:
        return
    line = f"sweep dir{'s' if len(dirs) > 1 else ''}: {', '.join(dirs)}"
    if Path(sweep_dir).resolve() not in {Path(d).resolve() for d in dirs}:
        line += f" (its multirun.yaml is in {Path(sweep_dir).resolve()})"
    print(line, flush=True)


def _outcome_sweep_dir(outcome: JobOutcome, sweep_dir: str) -> str:
    """The sweep dir job *outcome* ran in (see :func:`say_where_the_jobs_went`)."""
    run_dir = Path(outcome.run_dir).resolve()
    for candidate in (outcome.sweep_dir, sweep_dir):
        if candidate and run_dir.is_relative_to(Path(candidate).resolve()):
            return os.path.abspath(candidate)
    return str(Path(outcome.run_dir).parent)


def _job_sweep_dir(config: DictConfig) -> str:
    """The absolute ``hydra.sweep.dir`` of the job whose Hydra config is *config* (empty when unresolvable).

    Resolved as Hydra's launcher resolved it to make the job's run dir (the job's own config:
    a ``${recipe}`` or ``${now:...}`` in it has the job's value), relative to where the job runs.
    """
    try:
        return os.path.abspath(str(OmegaConf.select(config, "hydra.sweep.dir")))
    except Exception:  # an interpolation only the launcher could resolve: the run dir's parent stands in
        return ""


def _summary_status(run_dir: Path) -> str:
    """What a job's ``summary.json`` says of it (``failed`` when it has none)."""
    status = _read_json(run_dir / SUMMARY_FILE).get("status")
    return str(status) if status else "failed"
