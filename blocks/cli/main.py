"""``blocks``: the command line (run, plan, list, eval, export, report, new-package).

Config mistakes end with exit status 2 and a message naming the key and the fix, never a
traceback. ``plan``, ``list`` and ``report`` never import torch.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import io
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from blocks import __version__
from blocks.launch.collector import collection_paused, own_this_process, skip_final_collection
from blocks.spec.block import KINDS
from blocks.spec.errors import BlocksError, Problem, TrainingError, did_you_mean

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from blocks.core.jobs import Job
    from blocks.core.pipeline import Pipeline
    from blocks.core.plan import Plan
    from blocks.launch.driver import Checked
    from blocks.launch.pipeline import StageProblems

EXIT_INVALID = 2

_HYDRA_INFO_FLAGS = ("cfg", "info", "help", "hydra_help", "shell_completion", "experimental_rerun")

stdout = Console(soft_wrap=False)
stderr = Console(stderr=True)


RUN_HEADER = "blocks: the configuration has problems; nothing was started"
PLAN_HEADER = "blocks plan: the configuration does not compose"
LIST_HEADER = "blocks list: nothing was listed"
NEW_PACKAGE_HEADER = "blocks new-package: nothing was created"
REPORT_HEADER = "blocks report: no report was written"
EVAL_HEADER = "blocks eval: nothing was evaluated"
EXPORT_HEADER = "blocks export: nothing was exported"
DATA_HEADER = "blocks data: nothing was prepared"
_HEADERS = {
    "run": RUN_HEADER,
    "plan": PLAN_HEADER,
    "list": LIST_HEADER,
    "new-package": NEW_PACKAGE_HEADER,
    "report": REPORT_HEADER,
    "eval": EVAL_HEADER,
    "export": EXPORT_HEADER,
    "data": DATA_HEADER,
}


def _fail(error: BlocksError, header: str = RUN_HEADER) -> int:
    from blocks.cli.render import print_problems

    print_problems(stderr, error.problems, header=header)
    return error.exit_code


def load_catalog() -> None:
    """Load blocks and recipes; print the recipe files that could not load as warnings on stderr."""
    from blocks.cli.render import print_problems
    from blocks.core import catalog, packages

    catalog.load()
    problems = [p.warning() for p in catalog.load_problems()]
    problems += [p.problem() for p in packages.package_problems()]
    if problems:
        print_problems(stderr, problems)


def cmd_plan(
    overrides: Sequence[str], *, as_json: bool, multirun: bool, config_dir: str | None = None
) -> int:
    """Compose and check; print the plan(s). 0 when valid, 2 when not.

    *config_dir* is ``--config-dir``: a directory of presets searched first, as ``blocks run`` does.
    """
    from blocks.cli.render import plan_panel, print_problems

    chosen = _pipeline_of(overrides)
    if chosen is not None:
        recipe, pipeline = chosen
        root, rest = _pipeline_args(recipe, overrides)
        stage_plans = dict(_plan_stages(pipeline, root, rest))
        valid = all(plan.ok for plan in stage_plans.values())
        evaluations = _evaluation_problems(pipeline, root, rest) if valid else None
        if as_json:
            print(json.dumps(_pipeline_json(pipeline, stage_plans, evaluations, checked=valid), indent=2))
        for stage in pipeline.stages if not as_json else []:
            stdout.print(f"[bold]stage:[/] {escape(stage.name)}", highlight=False)
            if stage.name in stage_plans:
                stdout.print(plan_panel(stage_plans[stage.name]))
            else:
                stdout.print(f"  {escape(_stage_line(stage))}", highlight=False)
        if evaluations is not None and not as_json:
            return _fail(evaluations, evaluations.header(recipe).replace("; nothing was started", ""))
        return 0 if valid and evaluations is None else EXIT_INVALID
    plans = []
    try:
        job_overrides, space = (
            _sweep_jobs(list(overrides), config_dir) if multirun else ([list(overrides)], None)
        )
    except BlocksError as exc:
        return _invalid_plan(exc, list(overrides), as_json=as_json)
    hydra_configs = []
    for one in job_overrides:
        try:
            composed, plan = _plan_job(one, config_dir, multirun=multirun)
        except BlocksError as exc:
            return _invalid_plan(exc, one, as_json=as_json)
        plans.append((one, plan))
        hydra_configs.append((one, composed.hydra_config))
    shared = []
    if multirun and space is None:  # a search's planned trials are not the ones it samples
        from blocks.launch.sweep import shared_checkpoint_dirs, shared_run_dirs

        shared = shared_checkpoint_dirs(plans) + shared_run_dirs(hydra_configs)
    elif multirun and all(plan.ok for _, plan in plans):
        shared = _search_shared_checkpoint_dir(list(overrides), config_dir, space or {})
    if multirun:
        from blocks.launch.sweep import mixed_objectives

        shared += mixed_objectives(plans)
    if as_json:
        payload = [dict(plan.to_json(), overrides=one) for one, plan in plans]
        if shared:  # every job of the sweep takes part in the clash
            for job in payload:
                job["valid"], job["problems"] = False, [*job["problems"], *(p.to_json() for p in shared)]
        print(json.dumps(payload if multirun else payload[0], indent=2))
    else:
        for one, plan in plans:
            if multirun:
                stdout.print(f"[bold]job:[/] {escape(' '.join(one)) or '(no overrides)'}", highlight=False)
            stdout.print(plan_panel(plan))
        if shared:
            print_problems(stderr, shared, header="blocks plan: the jobs of the sweep clash")
    return 0 if all(plan.ok for _, plan in plans) and not shared else EXIT_INVALID


def _sweep_jobs(
    overrides: list[str], config_dir: str | None
) -> tuple[list[list[str]], dict[Any, Any] | None]:
    """The jobs a sweep's precheck plans, and the space it searches (None: not a search).

    Every job of a basic sweep, or the trials of a search (Optuna's) that try each choice once
    (see :func:`blocks.core.sweeper.searched_trials`).
    """
    from blocks.core.sweeper import searched_trials
    from blocks.launch.sweep import expand_sweep

    space = _search_space(overrides, config_dir)
    if space is None:
        return expand_sweep(overrides), None
    return searched_trials(overrides, space), space


def _search_shared_checkpoint_dir(
    overrides: list[str], config_dir: str | None, space: dict[Any, Any]
) -> list[Problem]:
    """The problem of a search whose trials would all keep their checkpoints in one ``checkpoint.dir``.

    Two trials apart in every searched key (:func:`blocks.core.sweeper.apart_trials`) are
    planned: a directory they share names no searched key, so every trial would resume the
    checkpoints of the one before. None when the trials cannot be planned (their problems are
    reported as those of the planned trials).
    """
    from blocks.core.sweeper import apart_trials
    from blocks.launch.sweep import shared_checkpoint_dirs

    trials, searched = apart_trials(overrides, space)
    if len(trials) < 2 or not searched:
        return []
    plans = []
    for one in trials:
        try:
            _, plan = _plan_job(one, config_dir, multirun=True)
        except BlocksError:
            return []
        plans.append((one, plan))
    return shared_checkpoint_dirs(plans, searched=searched)


def _search_space(overrides: list[str], config_dir: str | None) -> dict[Any, Any] | None:
    """What the sweep's sweeper searches besides the command line (``hydra.sweeper.params``); None for Hydra's basic one.

    The sweep is composed without its swept keys (not planned: its jobs are) to read its
    ``hydra.sweeper``. The command line may choose the sweeper (``hparams_search=``,
    ``hydra/sweeper=``); otherwise a preset may (an experiment that chooses ``hparams_search``,
    a project's conf dir).
    """
    from omegaconf import OmegaConf

    from blocks.core import jobs
    from blocks.core.overrides import without_sweeps

    named = next((o.split("=", 1)[1] for o in overrides if o.startswith("hydra/sweeper=")), None)
    chosen = any(o.startswith("hparams_search=") for o in overrides) or named not in (None, "basic")
    if named == "basic" and not chosen:
        return None
    try:
        job = jobs.compose_job(without_sweeps(overrides), config_dir)
    except BlocksError:
        return {} if chosen else None  # planning the jobs reports why the sweep does not compose
    target = str(OmegaConf.select(job.hydra_config, "hydra.sweeper._target_", default=""))
    if not chosen and target.endswith("BasicSweeper"):
        return None
    params = OmegaConf.select(job.hydra_config, "hydra.sweeper.params", default=None)
    searched = OmegaConf.to_container(params) if params is not None else {}
    return searched if isinstance(searched, dict) else {}


def _invalid_plan(error: BlocksError, overrides: list[str], *, as_json: bool) -> int:
    """Print the problems of a command line that does not compose (as JSON with ``--json``); 2."""
    if not as_json:
        return _fail(error, header=PLAN_HEADER)
    problems = [p.to_json() for p in error.problems]
    print(json.dumps({"valid": False, "overrides": overrides, "problems": problems}, indent=2))
    return EXIT_INVALID


def cmd_list(kind: str | None, *, as_json: bool) -> int:
    """Print every registered block (of one kind), or the options of a config group.

    Without a kind, the blocks are followed by the options of every group (presets and
    recipes included); ``blocks list recipe`` (or experiment, debug, hparams_search) lists
    that group's options.
    """
    from blocks.cli.options import all_options
    from blocks.cli.render import entry_json, options_table, registry_table
    from blocks.core import catalog
    from blocks.core.compose import GROUPS
    from blocks.spec.registry import REGISTRY

    if kind is not None and kind not in GROUPS:
        hint = did_you_mean(kind, GROUPS)
        error = BlocksError(
            Problem(
                "kind",
                f"'{kind}' is not a block kind or config group" + (f"; {hint}" if hint else ""),
                f"blocks list <kind> with one of: {', '.join(GROUPS)}",
            )
        )
        return _fail(error, LIST_HEADER)
    catalog.load()
    if kind is not None and kind not in KINDS:
        options = all_options()[kind]
        if as_json:
            print(json.dumps({"group": kind, "options": options}, indent=2))
        else:
            stdout.print(options_table({kind: options}))
        return 0
    entries = REGISTRY.entries(kind)
    if as_json:
        # default=repr: a package's default no config can hold still lists, beside every other block
        print(json.dumps([entry_json(e) for e in entries], indent=2, default=repr))
        return 0
    stdout.print(registry_table(entries))
    if kind is None:
        stdout.print(options_table(all_options()))
    return 0


def cmd_new_package(name: str, directory: str | None, namespace: str | None) -> int:
    """Scaffold a block package that installs and passes its own conformance test."""
    from pathlib import Path

    from blocks.cli.scaffold import new_package

    target = Path(directory) if directory else Path(name)
    written = new_package(name, target, namespace)
    shown = target if target.is_absolute() else f"./{target}"
    stdout.print(f"created {shown} ({len(written)} files):", highlight=False, markup=False)
    for path in written:
        stdout.print(f"  {path.relative_to(target)}", highlight=False, markup=False)
    stdout.print(
        f"next: pip install -e {shown} && pytest {shown}/tests",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return 0


def cmd_eval(source: str, overrides: Sequence[str], *, split: str, as_json: bool) -> int:
    """Print the metrics of the model at *source* on its data block (with *overrides*), and the weights scored."""
    from rich.table import Table
    from rich.text import Text

    from blocks.launch.evaluate import evaluation

    scored = evaluation(source, overrides, split=split)
    said = [f"weights: {scored.weights.describe()}", *scored.notes]
    if as_json:  # the metrics alone on stdout, for a program to read; what they score and the notes on stderr
        print(json.dumps(scored.metrics, indent=2))
        sys.stdout.flush()
        for line in said:
            stderr.print(line, highlight=False, markup=False, soft_wrap=True)
        return 0
    table = Table(title=f"{escape(source)} on the {escape(split)} split", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in scored.metrics.items():
        table.add_row(Text(name), f"{value:.6g}")
    stdout.print(table)
    for line in said:
        stdout.print(line, highlight=False, markup=False, soft_wrap=True)
    return 0


def cmd_export(source: str, out: str) -> int:
    """Write the model at *source* to directory *out* (``model.safetensors`` + ``model.json``)."""
    from blocks.core.compose import config_to_blocks

    with collection_paused():
        from blocks.runtime.model_export import MODEL_FILE, export_model, package_notes, run_config

    written = export_model(source, Path(out))
    for note in package_notes(source, config_to_blocks(run_config(source))):
        stdout.print(note, highlight=False, markup=False, soft_wrap=True)
    weights = json.loads((written / MODEL_FILE).read_text())["weights"]
    step = weights["step"] if weights["step"] is not None else "unknown"
    stdout.print(
        f"exported the weights of {weights['url']} (step {step}) to {written}: "
        f"load it with blocks.load_model({str(written)!r})",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return 0


def cmd_report(path: str, *, objective: str | None, mode: str | None) -> int:
    """Write plots and summary tables of a run dir, a sweep dir or a pipeline dir into ``<dir>/report/``."""
    from pathlib import Path

    from blocks.monitor.report import write_report

    out = write_report(Path(path), objective=objective, mode=mode)
    stdout.print(f"report: {out / 'report.html'}", highlight=False, markup=False, soft_wrap=True)
    stdout.print(f"        {out / 'report.md'}", highlight=False, markup=False, soft_wrap=True)
    return 0


def _precheck(args: Sequence[str]) -> int | Checked | None:
    """Plan every job the command line would launch; print problems and return 2 if any fails.

    A single run is composed once and planned once, as it will run: the returned
    :class:`~blocks.launch.driver.Checked` goes to Hydra's job runner and the driver as is.
    None: Hydra runs the command line (a sweep, or one of its informational flags).
    """
    from blocks.cli.render import print_problems
    from blocks.compat.hydra_private import hydra_args_parser
    from blocks.launch.driver import PLANNED, job_key
    from blocks.launch.sweep import mixed_objectives, shared_checkpoint_dirs, shared_run_dirs
    from blocks.spec.imports import refuse_objects

    PLANNED.clear()
    parsed = hydra_args_parser().parse_args(list(args))
    _refuse_combined_modes(parsed)
    for flag, value in (("--config-name", parsed.config_name), ("--config-path", parsed.config_path)):
        if value:
            raise BlocksError(
                Problem(
                    flag,
                    "blocks composes its own primary config; another one would skip its checks",
                    "add your presets with --config-dir DIR (or hydra.searchpath) and choose them with overrides",
                )
            )
    if parsed.experimental_rerun:
        raise BlocksError(
            Problem(
                "--experimental-rerun",
                "Hydra's rerun unpickles the file it is given, which can run any code",
                "rerun with the overrides in the run dir's .hydra/overrides.yaml instead",
                check="import-denied",
            )
        )
    if parsed.shell_completion:
        return None
    if parsed.hydra_help and (parsed.overrides or parsed.config_dir):
        raise BlocksError(
            Problem(
                "--hydra-help",
                "Hydra's flags help configures logging from the overrides and presets it is given, "
                "without the primary config blocks checks",
                "run `blocks run --hydra-help` alone",
            )
        )
    if any(getattr(parsed, flag, None) for flag in _HYDRA_INFO_FLAGS):
        multirun = parsed.multirun or "hydra.mode=MULTIRUN" in parsed.overrides
        return _check_composes(with_mode(parsed.overrides, multirun=multirun), parsed.config_dir)
    overrides = list(parsed.overrides)
    multirun = parsed.multirun or "hydra.mode=MULTIRUN" in overrides
    if not multirun:
        return _check_single(overrides, parsed.config_dir)
    job_overrides, space = _sweep_jobs(overrides, parsed.config_dir)
    failed = 0
    hydra_configs = []  # of the jobs the basic sweeper will launch, in its order
    warnings: dict[tuple[str, str, str], Problem] = {}  # each distinct one, shown once
    preflighted: list[tuple[Any, BlocksError | None]] = []  # each distinct data block's preflight
    for one in job_overrides:
        header = RUN_HEADER
        if len(job_overrides) > 1:
            header = f"blocks: job [{' '.join(one)}] has problems; no job of the sweep was started"
        try:
            job, plan = _plan_job(one, parsed.config_dir, multirun=True)
            hydra_configs.append((one, job.hydra_config))
        except BlocksError as exc:
            _fail(exc, header)
            failed += 1
            continue
        for problem in plan.warnings:
            warnings.setdefault((problem.key, problem.message, problem.fix), problem)
        if not plan.ok:
            print_problems(stderr, plan.errors, header=header)
            failed += 1
            continue
        try:
            with collection_paused():  # a block's import path may import torch and Lightning
                refuse_objects(plan.blocks.values())
            _preflight_data(plan, preflighted)
        except BlocksError as exc:
            _fail(exc, header)
            failed += 1
            continue
        PLANNED[job_key(one)] = plan  # a job Hydra runs in this process is not planned again
    shared = []
    if space is None:  # a search's planned trials are not the ones it samples
        shared = shared_checkpoint_dirs(
            [(one, PLANNED[job_key(one)]) for one in job_overrides if job_key(one) in PLANNED]
        )
        if len(hydra_configs) == len(job_overrides):
            shared += shared_run_dirs(hydra_configs)
    elif not failed:
        shared = _search_shared_checkpoint_dir(overrides, parsed.config_dir, space)
    shared += mixed_objectives(
        [(one, PLANNED[job_key(one)]) for one in job_overrides if job_key(one) in PLANNED]
    )
    if shared:
        print_problems(stderr, shared, header="blocks: the jobs of the sweep clash; no job was started")
        failed += 1
    if warnings:
        print_problems(
            stdout, warnings.values(), header="blocks: warnings of the sweep's jobs (each shown once)"
        )
    if failed:
        PLANNED.clear()
        return EXIT_INVALID
    stdout.print(f"[green]planned {len(job_overrides)} job(s): all valid[/]", highlight=False)
    return None


def _preflight_data(plan: Plan, done: list[tuple[Any, BlocksError | None]]) -> None:
    """Run the I/O checks of *plan*'s data block, once per distinct block of a sweep (*done*: those run, with what each raised).

    A single run's driver does them before anything starts (shards missing from their storage,
    an unreachable bucket); a sweep's precheck does them for every job before the first starts.
    """
    data = plan.blocks["data"]
    found = [error for seen, error in done if seen == data]
    if found:
        error = found[0]
    else:
        try:
            plan.data.preflight()
            error = None
        except BlocksError as exc:
            error = exc
        done.append((data, error))
    if error is not None:
        raise error


def _plan_job(overrides: Sequence[str], config_dir: str | None, *, multirun: bool) -> tuple[Job, Plan]:
    """Compose and plan one job (of a sweep when *multirun*), as :func:`blocks.core.jobs.plan`, with Hydra's config of it."""
    from blocks.core import catalog, jobs

    with catalog.current().active():
        job, _, plan = jobs.plan_job(with_mode(overrides, multirun=multirun), None, config_dir)
    return job, plan


def with_mode(overrides: Sequence[str], *, multirun: bool) -> list[str]:
    """*overrides* with the ``hydra.mode`` Hydra will run them in, so checks of the other mode's settings keep out.

    Hydra's compose leaves the mode unset; a sweep never uses ``hydra.run.dir``, a single run
    never ``hydra.sweep.dir`` (a file named ``outputs`` where a sweep starts is no problem).
    """
    if any(o.split("=", 1)[0].lstrip("+") == "hydra.mode" for o in overrides):
        return list(overrides)
    return [*overrides, f"hydra.mode={'MULTIRUN' if multirun else 'RUN'}"]


def _check_composes(overrides: list[str], config_dir: str | None) -> int | None:
    """For ``--cfg``, ``--info``, ``--hydra-help``: the composition Hydra will show passes blocks' checks first.

    Hydra composes the overrides for these flags too, and configures its logging from them
    (whose handlers it imports and calls); 2 when they do not pass, None to let Hydra go on.
    """
    from blocks.core import jobs

    try:
        jobs.compose(overrides, config_dir)
    except BlocksError as exc:
        return _fail(exc, RUN_HEADER)
    return None


def _check_single(overrides: list[str], config_dir: str | None) -> int | Checked:
    """Compose and plan a single run once, print its plan, run its preflight; 2 when it has problems."""
    from blocks.cli.render import plan_panel, print_problems
    from blocks.launch.driver import check_run, plan_run

    try:
        job, composed, plan = plan_run(overrides, config_dir)
    except BlocksError as exc:
        return _fail(exc, RUN_HEADER)
    stdout.print(plan_panel(plan))
    if not plan.ok:
        print_problems(stderr, plan.errors, header=RUN_HEADER)
        return EXIT_INVALID
    try:
        return check_run(job, composed, plan)
    except BlocksError as exc:
        return _fail(exc, RUN_HEADER)


def _refuse_combined_modes(parsed: argparse.Namespace) -> None:
    """Hydra runs one of --run, -m, --cfg, --info and --shell-completion; it raises a bare ValueError for more."""
    modes = {
        "--run": parsed.run,
        "-m/--multirun": parsed.multirun,
        "--cfg": parsed.cfg is not None,
        "--info": parsed.info is not None,
        "--shell-completion": parsed.shell_completion,
    }
    chosen = [flag for flag, on in modes.items() if on]
    if len(chosen) > 1:
        raise BlocksError(
            Problem(
                chosen[1],
                f"{' and '.join(chosen)} cannot be combined: Hydra does one of them per command",
                "drop one of them; to see a sweep job's config, run --cfg job with that job's values (no -m)",
            )
        )


def _pipeline_of(args: Sequence[str]) -> tuple[str, Pipeline] | None:
    """The pipeline recipe the command line chooses (``recipe=NAME``), or None for a single job."""
    from blocks.core.recipe import RECIPES

    chosen = [a.split("=", 1)[1] for a in args if a.startswith("recipe=")]
    if not chosen:
        return None
    try:
        entry = RECIPES.get(chosen[-1])
    except BlocksError:
        return None  # Hydra reports an unknown recipe with its own hint
    try:
        pipeline = entry.pipeline()
    except Exception:  # composing makes the recipe again, and reports its file and line
        return None
    return (entry.name, pipeline) if pipeline is not None else None


def _plan_stages(pipeline: Pipeline, root: Path, args: Sequence[str]) -> list[tuple[str, Plan]]:
    """The plan of every train stage, as it will run under *root*."""
    from blocks.core import jobs
    from blocks.core.pipeline import Train
    from blocks.launch.pipeline import train_overrides

    return [
        (stage.name, jobs.plan(train_overrides(pipeline, stage, root, args)))
        for stage in pipeline.stages
        if isinstance(stage, Train)
    ]


def _evaluation_problems(pipeline: Pipeline, root: Path, rest: list[str]) -> StageProblems | None:
    """What ``blocks run`` checks before its first stage, each evaluation against its source's config: the problems, else None."""
    from blocks.launch.pipeline import StageProblems, check_evaluations, stage_settings

    try:
        settings = {stage.name: stage_settings(pipeline, stage, root, rest) for stage in pipeline.stages}
        check_evaluations(pipeline, settings)
    except StageProblems as exc:
        return exc
    return None


def _pipeline_json(
    pipeline: Pipeline, stage_plans: dict[str, Plan], evaluations: StageProblems | None, *, checked: bool
) -> dict[str, Any]:
    """``blocks plan --json`` of a pipeline: each stage by name, in order; a train stage's plan, else what it does.

    An evaluation is checked against its source's config only when every train stage is valid
    (*checked*); until then its ``valid`` is null.
    """
    payload: dict[str, Any] = {}
    for stage in pipeline.stages:
        if stage.name in stage_plans:
            payload[stage.name] = stage_plans[stage.name].to_json()
            continue
        problems = evaluations.problems if evaluations is not None and evaluations.stage == stage.name else []
        payload[stage.name] = {
            "stage": type(stage).__name__.lower(),
            "does": _stage_line(stage),
            "valid": not problems if checked else None,
            "problems": [problem.to_json() for problem in problems],
        }
    return payload


def _stage_line(stage: object) -> str:
    """What an evaluation or export stage does, in one line (a train stage shows its plan)."""
    from blocks.core.pipeline import Evaluate

    if isinstance(stage, Evaluate):
        said = " ".join(stage.overrides)
        return f"evaluate {stage.source}'s model on its {stage.split} split" + (
            f" with {said}" if said else ""
        )
    return f"export {getattr(stage, 'source', '')}'s model"


def _pipeline_args(name: str, args: Sequence[str]) -> tuple[Path, list[str]]:
    """The pipeline dir (``hydra.run.dir=`` or ``outputs/<recipe>``) and the remaining overrides."""
    root = Path("outputs") / name
    rest = []
    for arg in args:
        if arg.startswith("hydra.run.dir="):
            if not arg.split("=", 1)[1].strip():
                raise BlocksError(
                    Problem("hydra.run.dir", "is empty, which is no directory", "hydra.run.dir=<a directory>")
                )
            root = Path(arg.split("=", 1)[1])
        elif arg.startswith("-") or arg.startswith("hydra"):
            raise BlocksError(
                Problem(
                    arg,
                    f"recipe={name} is a pipeline; it runs its stages itself, without Hydra flags or hydra.* settings",
                    "drop it; hydra.run.dir=DIR sets the pipeline dir",
                )
            )
        elif not arg.startswith("recipe="):
            rest.append(arg)
    return root, rest


def cmd_run_pipeline(name: str, pipeline: Pipeline, args: Sequence[str]) -> int:
    """Plan every train stage, then run the stages not finished yet (``blocks run recipe=<pipeline>``)."""
    from blocks.cli.render import print_problems
    from blocks.launch.driver import JobFailed
    from blocks.launch.pipeline import StageProblems, run_pipeline

    root, overrides = _pipeline_args(name, args)
    for stage, plan in _plan_stages(pipeline, root, overrides):
        if not plan.ok:
            print_problems(
                stderr,
                plan.errors,
                header=f"blocks: stage '{stage}' of recipe={name} has problems; nothing was started",
            )
            return EXIT_INVALID
    stdout.print(f"pipeline dir: {root}", highlight=False, markup=False, soft_wrap=True)
    try:
        run_pipeline(
            pipeline, root, overrides, say=lambda text: stdout.print(text, highlight=False, markup=False)
        )
    except StageProblems as exc:
        return _fail(exc, exc.header(name))
    except JobFailed as exc:
        print(f"blocks: {exc}", file=sys.stderr)
        return exc.exit_status
    except TrainingError as exc:  # met once a stage's training started: it failed
        return _fail(exc, "blocks: training failed (its summary.json says failed and why)")
    return 0


def cmd_run(args: Sequence[str]) -> int:
    """Check every job, then hand the command line to Hydra, which runs the driver per job."""
    from blocks.launch.sweep import expand_group_globs

    if any(arg in ("-h", "--help") for arg in args):
        return cmd_run_help()
    _refuse_non_integer_ranks()
    args = expand_group_globs(_flags_first(args))
    chosen = _pipeline_of(args)
    if chosen is not None:
        return cmd_run_pipeline(*chosen, args)
    checked = _precheck(args)
    if isinstance(checked, int):
        return checked
    from blocks.compat.hydra_private import run_composed, run_hydra_app
    from blocks.core.compose import PRIMARY_CONFIG
    from blocks.core.overrides import keep_shipped_searchpath
    from blocks.launch.driver import PLANNED
    from blocks.launch.sweep import FAILED_JOBS

    if checked is not None:
        assert checked.hydra_config is not None
        _make_run_dir(checked.run_dir)
        run_composed(checked.hydra_config, functools.partial(run_and_say_where, checked=checked))
        return 0
    FAILED_JOBS.clear()
    try:
        run_hydra_app(keep_shipped_searchpath(args), run_and_say_where, PRIMARY_CONFIG)
    finally:
        PLANNED.clear()
    return 1 if FAILED_JOBS else 0


RANK_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "SLURM_PROCID",
)
"""Variables torch, Lightning and blocks read as integers (a process's place in a distributed job)."""


def _refuse_non_integer_ranks() -> None:
    """A rank variable that is set but no integer (``RANK=abc``) would crash the run inside Lightning."""
    import os

    for name in RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None and not value.strip().lstrip("-").isdigit():
            raise BlocksError(
                Problem(
                    name,
                    f"the environment variable {name}={value!r} is not an integer; torch and Lightning read it as one",
                    f"unset {name} (a launcher such as torchrun or SLURM sets it), or set it to a number",
                )
            )


def _make_run_dir(run_dir: Path) -> None:
    """Create the run dir before Hydra does, so a path that cannot be created is a config error, not a traceback."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BlocksError(
            Problem(
                "hydra.run.dir",
                f"the run dir '{run_dir}' cannot be created: {exc.strerror or exc}",
                "hydra.run.dir=<a directory you can write>",
            )
        ) from None


RUN_USAGE = """usage: blocks run [OVERRIDE ...] [-m] [--config-dir DIR] [--cfg job] [--info] [-sc install=bash]

Compose the job from config groups and overrides, check it (as blocks plan does), then train.
-m sweeps (a,b / range(...) / glob(...)), --config-dir DIR adds your YAML presets, --cfg job prints
the composed config, --hydra-help shows Hydra's own flags.
"""


def cmd_run_help() -> int:
    """``blocks run --help``: the usage, then every config group with its options."""
    from blocks.cli.options import groups_help

    print(RUN_USAGE)
    print(groups_help("run"))
    return 0


def run_and_say_where(cfg: DictConfig, checked: Checked | None = None) -> float | None:
    """The Hydra task of ``blocks run``: print the job's run dir (a single run's, or a sweep job's), then run the driver (with the *checked* run)."""
    from hydra.core.hydra_config import HydraConfig

    from blocks.launch.driver import run_job

    stdout.print(
        f"run dir: {HydraConfig.get().runtime.output_dir}", highlight=False, markup=False, soft_wrap=True
    )
    return run_job(cfg, checked)


def _plan_epilog() -> str:
    """Every config group and its options, for ``blocks plan --help`` (it loads the catalog)."""
    from blocks.cli.options import groups_help
    from blocks.core import catalog

    catalog.load()
    return groups_help("plan")


def build_parser(*, plan_help: bool = False) -> argparse.ArgumentParser:
    """The argument parser of ``blocks``; with *plan_help*, ``plan --help`` lists every group's options."""
    parser = argparse.ArgumentParser(
        prog="blocks",
        description="Compose training runs from typed blocks, check them, run them.",
    )
    parser.add_argument("--version", action="version", version=f"blocks {__version__}")
    parser.add_argument(
        "--recipes",
        metavar="DIR",
        action="append",
        help="a directory of recipe files to load (repeatable; adds to BLOCKS_PATH and [tool.blocks] recipes)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="compose, check, then train (Hydra overrides, -m sweeps and Hydra flags work)",
        add_help=False,
    )
    run.add_argument("args", nargs=argparse.REMAINDER)
    plan = sub.add_parser(
        "plan",
        help="compose and check only; print the plan (exit 2 when invalid)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_plan_epilog() if plan_help else None,
    )
    plan.add_argument(
        "overrides", nargs="*", default=[], help="Hydra overrides, e.g. optim.lr=3e-4 strategy=single"
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("-m", "--multirun", action="store_true", help="plan every job of a sweep")
    plan.add_argument(
        "-cd", "--config-dir", help="a directory of YAML presets (<group>/<name>.yaml), searched first"
    )
    lst = sub.add_parser("list", help="every registered block with its fields")
    lst.add_argument(
        "kind",
        nargs="?",
        help=f"a block kind ({', '.join(KINDS)}) or recipe, experiment, debug, hparams_search",
    )
    lst.add_argument("--json", action="store_true", help="print as JSON")
    new = sub.add_parser(
        "new-package", help="scaffold a pip-installable block package with its conformance test"
    )
    new.add_argument("name", help="distribution name, e.g. acme-vision")
    new.add_argument("--dir", help="where to write it (default: ./NAME; must not exist)")
    new.add_argument("--namespace", help="entry-point name, the prefix of its blocks (default: from NAME)")
    report = sub.add_parser(
        "report", help="plots and summary tables of a run dir, a sweep dir or a pipeline dir"
    )
    report.add_argument(
        "path",
        metavar="RUN_DIR|SWEEP_DIR|PIPELINE_DIR",
        help="a run dir, the sweep dir of blocks run -m, or the dir of a pipeline recipe's run",
    )
    report.add_argument("--objective", help="metric that ranks a sweep's jobs (default: monitor.objective)")
    report.add_argument("--mode", choices=("min", "max"), help="min or max (default: monitor.objective_mode)")
    ev = sub.add_parser("eval", help="metrics of a run dir, checkpoint or export on a data block")
    ev.add_argument("source", help="a run dir, a committed checkpoint directory, or an export directory")
    # default: optional (a nargs="*" positional without one is listed as required when the one before it is missing)
    ev.add_argument(
        "overrides", nargs="*", default=[], help="data=NAME or data.KEY=VALUE (e.g. data.batch_size=256)"
    )
    ev.add_argument(
        "--split",
        default="val",
        help="the split to score: train, val or test (default: val; test needs data.test_fraction at train time)",
    )
    ev.add_argument("--json", action="store_true", help="print the metrics as JSON")
    ex = sub.add_parser("export", help="write a model as safetensors + its model block (blocks.load_model)")
    ex.add_argument("source", help="a run dir or a committed checkpoint directory")
    ex.add_argument("out", help="the directory to write")
    from blocks.data.shards.cli import add_data_parser

    add_data_parser(sub)
    return parser


@contextlib.contextmanager
def _root_logging_restored() -> Iterator[None]:
    """The root logger's handlers and level as they were, once a command is done.

    A ``blocks run`` configures logging for its job (Hydra's ``job_logging``: the console and
    the run dir's ``blocks.log``); a process ends there, but a caller of :func:`run_captured`
    goes on, and its later records must not land in the last run's log.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def run_captured(argv: Sequence[str]) -> tuple[int, str]:
    """Run the CLI in this process with its output captured: (exit status, everything it printed).

    What ``python -m blocks ARGV`` would do, without a process per call (tests, tools that
    plan many command lines). An exception that is not a :class:`BlocksError` propagates, as
    it would end the real command with a traceback.
    """
    buffer = io.StringIO()
    code, output, _ = _captured(argv, buffer, buffer)
    return code, output


def run_captured_apart(argv: Sequence[str]) -> tuple[int, str, str]:
    """:func:`run_captured` with stdout and stderr apart: (exit status, stdout, stderr).

    For output a program reads (``--json``) that must not hold what the command says to a person.
    """
    return _captured(argv, io.StringIO(), io.StringIO())


def _captured(argv: Sequence[str], out: io.StringIO, err: io.StringIO) -> tuple[int, str, str]:
    """Run the CLI in this process, its stdout into *out* and its stderr into *err*: (status, stdout, stderr)."""
    global stdout, stderr
    saved = stdout, stderr
    # no file of their own: they write to sys.stdout/sys.stderr (the buffer), where main() hides secrets
    stdout = Console(width=200, soft_wrap=False, force_terminal=False, color_system=None)
    stderr = Console(stderr=True, width=200, force_terminal=False, color_system=None)
    code: int = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _root_logging_restored():
            main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        stdout, stderr = saved
    return code, out.getvalue(), err.getvalue()


def take_recipes_option(argv: list[str]) -> list[str]:
    """*argv* without ``--recipes DIR`` (anywhere); each DIR goes first into ``BLOCKS_PATH``.

    The environment carries it to every process a run starts (Hydra jobs, torchrun workers),
    which load the same recipe files.
    """
    import os

    from blocks.core.project import ENV_VAR

    rest: list[str] = []
    dirs: list[str] = []
    items = iter(argv)
    for arg in items:
        if arg == "--recipes":
            value = next(items, None)
            if value is None:
                raise BlocksError(Problem("--recipes", "--recipes needs a directory", "--recipes recipes/"))
            dirs.append(value)
        elif arg.startswith("--recipes="):
            dirs.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    if dirs:
        entries = [str(Path(d).resolve()) for d in dirs]
        old = os.environ.get(ENV_VAR, "")
        os.environ[ENV_VAR] = os.pathsep.join([*entries, *([old] if old else [])])
    return rest


def _parse_intermixed(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """*argv* parsed with flags anywhere among the overrides (``plan recipe=x --json optim.lr=1``).

    argparse takes one run of positionals; the overrides after a flag come back as extras, and
    join the command's overrides in their order. An unknown flag is still an error.
    """
    args, extras = parser.parse_known_args(argv)
    flags = [extra for extra in extras if extra.startswith("-")]
    if flags or (extras and not isinstance(getattr(args, "overrides", None), list)):
        parser.error(f"unrecognized arguments: {' '.join(flags or extras)}")
    if extras:
        args.overrides = [*args.overrides, *extras]
    return args


def _flags_first(args: Sequence[str]) -> list[str]:
    """``blocks run``'s arguments with Hydra's flags before the overrides, so a flag may come anywhere.

    Hydra's parser takes one run of overrides; ``run recipe=x -m optim.lr=1,2`` would end in its
    usage text. An unknown flag is a config error naming it.
    """
    from blocks.compat.hydra_private import hydra_args_parser

    parsed, extras = hydra_args_parser().parse_known_args(list(args))
    flags = [extra for extra in extras if extra.startswith("-")]
    if flags:
        raise BlocksError(
            Problem(
                flags[0], "is not a flag of blocks run", "see `blocks run --help` (overrides are key=value)"
            )
        )
    overrides = [*parsed.overrides, *extras]
    rest = list(args)
    for override in overrides:
        rest.remove(override)
    return [*rest, *overrides]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``blocks`` console script.

    A Ctrl-C exits 130 without a traceback, wherever it lands: a run handles its own (it saves
    and writes its summary), one after that (a second Ctrl-C as the run ends) or before a run
    starts ends the command here. Called without *argv* (the process is this command), a Ctrl-C
    while the process exits ends it at once, with the status the command ended with, or (in
    the interpreter's last moments) is ignored.
    """
    entry = argv is None
    if entry:  # registered first, so called last: Python's own finalization would die of a Ctrl-C
        atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)
        own_this_process()
    code: int | str | None = 1
    try:
        code = _command(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        from blocks.launch.torchrun import EXIT_INTERRUPTED

        print("blocks: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        code = EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader of the output left early (`blocks list --json | head`)
        _discard_stdout()
        code = 1  # as rich's console ends on its own broken pipe (and Python's docs advise)
    except SystemExit as exc:  # a job's command ends here too (blocks.launch.driver)
        code = exc.code
        raise
    finally:
        if entry:
            signal.signal(
                signal.SIGINT, functools.partial(_exit_at_once, code if isinstance(code, int) else 1)
            )
            skip_final_collection()
    sys.exit(code)


def _discard_stdout() -> None:
    """Point the standard output at /dev/null: the interpreter's last flush would fail again on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
    os.close(devnull)


def _command(argv: list[str]) -> int:
    """Parse *argv* and run its command; its exit status."""
    try:
        argv = take_recipes_option(argv)
    except BlocksError as exc:
        return _fail(exc, RUN_HEADER)
    from blocks.cli.completion import answer_query, is_query

    shell = is_query(argv)
    if shell is not None:
        return answer_query(shell)
    if argv and argv[0] in ("-sc", "--shell-completion"):
        argv = ["run", *argv]  # `blocks -sc install=bash`: Hydra's install, as `blocks run -sc` does
    if argv and argv[0] == "run":
        dispatch = lambda: cmd_run(argv[1:])  # noqa: E731 - Hydra parses run's arguments itself
    else:
        plan_help = argv[:1] == ["plan"] and any(arg in ("-h", "--help") for arg in argv)
        try:
            args = _parse_intermixed(build_parser(plan_help=plan_help), argv)
        except BlocksError as exc:
            return _fail(exc, _HEADERS.get(argv[0], RUN_HEADER))
        if args.command == "plan":
            dispatch = lambda: cmd_plan(  # noqa: E731
                args.overrides, as_json=args.json, multirun=args.multirun, config_dir=args.config_dir
            )
        elif args.command == "new-package":
            dispatch = lambda: cmd_new_package(args.name, args.dir, args.namespace)  # noqa: E731
        elif args.command == "report":
            dispatch = lambda: cmd_report(args.path, objective=args.objective, mode=args.mode)  # noqa: E731
        elif args.command == "eval":
            dispatch = lambda: cmd_eval(args.source, args.overrides, split=args.split, as_json=args.json)  # noqa: E731
        elif args.command == "export":
            dispatch = lambda: cmd_export(args.source, args.out)  # noqa: E731
        elif args.command == "data":
            from blocks.data.shards.cli import cmd_data

            dispatch = lambda: cmd_data(args)  # noqa: E731
        else:
            dispatch = lambda: cmd_list(args.kind, as_json=args.json)  # noqa: E731
    from blocks.core.masking import hiding_output

    with hiding_output():  # a value read from the environment is shown as ${oc.env:NAME}
        try:
            load_catalog()
            return dispatch()
        except BlocksError as exc:
            return _fail(exc, _HEADERS.get(argv[0], RUN_HEADER))


def _exit_at_once(code: int, signum: int, frame: Any) -> None:
    """A SIGINT handler for the command's last moments: end the process now, with exit status *code*.

    Python's exit (joining loader workers, flushing loggers) would print a Ctrl-C's traceback.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
