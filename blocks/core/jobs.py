"""From command-line overrides to a composed config, its blocks and its plan."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml
from omegaconf import DictConfig

from blocks.compat.hydra_private import hydra_config_set, initialize_hydra
from blocks.core import catalog as catalogs
from blocks.core import packages
from blocks.core.catalog import Catalog
from blocks.core.compose import (
    DEFAULT_RECIPE,
    PRIMARY_CONFIG,
    Composed,
    appended_block_fields,
    config_to_blocks,
    field_keys,
    interpolation_fix,
    split_hydra,
    translate_compose_error,
)
from blocks.core.environment import Environment
from blocks.core.hydra_node import hydra_problems
from blocks.core.launcher import as_elsewhere, launcher_problems, launches_elsewhere
from blocks.core.masking import hidden, hide_environment_values, hide_environment_values_in_overrides
from blocks.core.overrides import check_overrides, keep_shipped_searchpath
from blocks.core.plan import Plan, make_plan, preflight
from blocks.core.secrets import KeyPath, env_interpolations
from blocks.core.sweeper import sweeper_problems
from blocks.data.base import DataBlock
from blocks.spec.block import Block
from blocks.spec.errors import BlocksError, ConfigError, Problem
from blocks.spec.imports import interpolated_path_problem


def _compose_raw(overrides: Sequence[str], config_dir: str | None = None) -> DictConfig:
    """Hydra's composition; *config_dir* is ``--config-dir`` (searched first, as Hydra does)."""
    from hydra import compose

    with hydra_context(config_dir) as name:
        return compose(name, overrides=keep_shipped_searchpath(overrides), return_hydra_config=True)


@contextlib.contextmanager
def hydra_context(config_dir: str | None = None, catalog: Catalog | None = None) -> Iterator[str]:
    """Hydra's ``initialize`` for blocks' config, for your own code and tests; yields the config name.

    Loads everything that can be composed first (blocks, recipes, installed packages, the
    project's recipes and presets), so ``hydra.compose`` sees what ``blocks run`` sees::

        from hydra import compose
        from blocks import hydra_context

        with hydra_context() as name:
            cfg = compose(name, overrides=["recipe=mine", "optim=fastsgd"])

    *config_dir* is ``--config-dir``. The composed config has every kind's node; check it and
    get its plan with :func:`plan` (the same overrides), or its blocks with
    :func:`blocks.core.compose.config_to_blocks`. *catalog* is what can be composed (default:
    the current one, see :func:`blocks.core.catalog.current`); Hydra's ConfigStore holds its
    options only inside the block. Hydra's global state is left as it was found:
    a compose inside a running Hydra app (a pipeline stage, a sweep job) does not reset that app.
    """
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    outer = get_gh_backup()
    GlobalHydra.instance().clear()  # Hydra initializes only a cleared GlobalHydra
    if config_dir and not Path(config_dir).is_dir():
        raise ConfigError(
            Problem(
                "--config-dir",
                f"'{config_dir}' is not a directory",
                "--config-dir DIR, a directory of presets (DIR/<group>/<name>.yaml)",
            )
        )
    try:
        if config_dir:
            initialize_config_dir(
                version_base="1.3", config_dir=str(Path(config_dir).resolve()), job_name="blocks"
            )
        else:
            initialize_hydra("blocks")  # hydra.initialize without its stack walk
        with (catalog or catalogs.current()).installed():
            yield PRIMARY_CONFIG
    finally:
        restore_gh_from_backup(outer)


def _refuse_hydra_targets(cfg: DictConfig) -> None:
    """Every import path Hydra itself would use (callbacks, launcher, sweeper, logging) passes the import seam."""
    with hydra_config_set(cfg):  # ${hydra:...} resolves as when Hydra runs the job
        problems = hydra_problems(cfg.hydra)
    if problems:
        raise ConfigError(problems)


def compose(
    overrides: Sequence[str] = (), config_dir: str | None = None, *, catalog: Catalog | None = None
) -> Composed:
    """Compose the job config for *overrides* with Hydra; mistakes become one ``ConfigError`` with all of them.

    Hydra stops at the first override it cannot apply; this composes again without each
    failing override (and without the keys of a group whose option failed) to find the
    others, so the user sees every problem at once. Import paths in the ``hydra`` node are
    checked here too (see :mod:`blocks.core.hydra_node`). *catalog* is what can be composed
    (default: the current one).
    """
    with (catalog or catalogs.current()).active():
        composed, problems = _compose_collecting(overrides, config_dir)
    if problems:
        raise ConfigError(problems)
    assert composed is not None
    return composed


def _compose_once(
    overrides: Sequence[str], config_dir: str | None = None, known: KnownKeysMemo | None = None
) -> Composed:
    return _job_once(overrides, config_dir, known).composed


@dataclass(frozen=True)
class Job:
    """One composed job: Hydra's whole config (its ``hydra`` node included) and the job's own part.

    Attributes:
        hydra_config: what Hydra composed with ``return_hydra_config``; ``blocks run`` hands
            it to Hydra's job runner, so the run is not composed a second time.
        composed: the job config (without ``hydra``) and the chosen options.
    """

    hydra_config: DictConfig
    composed: Composed


def compose_job(overrides: Sequence[str] = (), config_dir: str | None = None) -> Job:
    """Hydra's config of one job (its ``hydra`` node included), composed once and not planned.

    For reading Hydra's own settings of a command line (the sweeper a sweep runs) without the
    cost of a plan. Raises ``ConfigError`` naming the first problem (:func:`compose` finds them all).
    """
    return _job_once(overrides, config_dir)


def _job_once(
    overrides: Sequence[str], config_dir: str | None = None, known: KnownKeysMemo | None = None
) -> Job:
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    catalogs.current().prepare(overrides)
    packages.refuse_unusable(packages.namespaces_in(overrides), overrides)
    hide_environment_values_in_overrides(overrides)  # a composition error may quote the value
    try:
        try:
            raw = _compose_raw(overrides, config_dir)
        except MissingConfigException:
            if not catalogs.current().make_recipes():
                raise
            raw = _compose_raw(overrides, config_dir)  # again, with every recipe's presets as options
        appended = appended_block_fields(overrides, raw)
        if appended:
            raise ConfigError(appended)
        _refuse_hydra_targets(raw)
        launcher = launcher_problems(raw) + sweeper_problems(raw)
        if launcher:
            raise ConfigError(launcher)
        return Job(hydra_config=raw, composed=split_hydra(raw))
    except ConfigError as unresolved:
        raise _name_interpolating_override(unresolved, overrides) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(_undecodable_preset(exc, overrides, config_dir)) from None
    except (HydraException, OmegaConfBaseException, ValueError, yaml.YAMLError) as exc:
        translated = translate_compose_error(exc, overrides, _KnownKeys(overrides, known, config_dir))
        raise _name_broken_recipe(_name_interpolating_override(translated, overrides), overrides) from None


def _undecodable_preset(exc: UnicodeDecodeError, overrides: Sequence[str], config_dir: str | None) -> Problem:
    """A preset that is not UTF-8 text: Hydra's error names no file; the chosen options under *config_dir* are looked at."""
    for override in overrides:
        group, _, option = override.lstrip("+").partition("=")
        path = Path(config_dir or ".", *group.split("/"), f"{option}.yaml")
        if not config_dir or "." in group or not path.is_file():
            continue
        try:
            path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            return Problem(
                group,
                f"the preset {path} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                f"save {path} as UTF-8 YAML, or choose another {group} option",
            )
    return Problem(
        "--config-dir" if config_dir else "hydra.searchpath",
        f"a preset of this composition is not UTF-8 text ({exc.reason} at byte {exc.start})",
        "save the presets you choose as UTF-8 YAML",
    )


def _chooses_or_searches(override: str) -> bool:
    """Whether *override* picks a group's option or sets the config search path (not a key's value)."""
    key = override.split("=", 1)[0]
    return key == "hydra.searchpath" or ("." not in key and not override.startswith(("+", "~")))


T = TypeVar("T")


def _collecting(overrides: Sequence[str], step: Callable[[list[str]], T]) -> tuple[T | None, list[Problem]]:
    """*step*'s result for the overrides that apply, and the problems of those that do not.

    Each failing round drops the overrides it named and tries again, so every wrong override is
    reported, however many (at most one round per override).
    """
    remaining, problems = check_overrides(overrides)
    while True:
        try:
            return step(remaining), _in_command_line_order(problems, overrides)
        except ConfigError as error:
            # a key already reported had its override dropped: a later round's problem with it is about the default
            reported = {p.key for p in problems}
            problems += [p for p in error.problems if p not in problems and p.key not in reported]
            dropped = _without_failing(remaining, error.problems)
            if dropped is None:
                return None, _in_command_line_order(problems, overrides)
            remaining = dropped


def _in_command_line_order(problems: list[Problem], overrides: Sequence[str]) -> list[Problem]:
    """*problems* in the order of the overrides they are about (a round may report several); others last."""
    keys = [_override_key(o) for o in overrides]

    def position(problem: Problem) -> int:
        about = (i for i, key in enumerate(keys) if problem.key and _within(key, problem.key))
        return next(about, len(keys))

    return sorted(problems, key=position)


def _within(key: str, prefix: str) -> bool:
    """Whether override key *key* is *prefix* or lies under it (``model.kwargs.x`` under ``model.kwargs``)."""
    return key == prefix or key.startswith((f"{prefix}.", f"{prefix}["))


def _compose_collecting(
    overrides: Sequence[str], config_dir: str | None = None
) -> tuple[Composed | None, list[Problem]]:
    """The composition of the overrides that apply, and the problems of those that do not."""
    return _collecting(overrides, functools.partial(_compose_once, config_dir=config_dir, known={}))


Freeze = Callable[[Job], Composed]
"""Turns a composed job into the config the run will use (``blocks run`` fills in run-dir defaults)."""


def _blocks_once(
    overrides: Sequence[str],
    config_dir: str | None = None,
    freeze: Freeze | None = None,
    known: KnownKeysMemo | None = None,
) -> tuple[Job, Composed, dict[str, Block]]:
    job = _job_once(overrides, config_dir, known)
    composed = freeze(job) if freeze is not None else job.composed
    try:
        blocks = config_to_blocks(composed.config)
    except ConfigError as exc:
        raise ConfigError([_preset_without_block(p, composed, config_dir) for p in exc.problems]) from None
    refuse_interpolated_paths(composed.config, blocks)
    return job, composed, blocks


def _preset_without_block(problem: Problem, composed: Composed, config_dir: str | None) -> Problem:
    """No block chosen though a preset of its kind was chosen and loaded: the preset lacks ``_block_``; name it."""
    option = composed.choices.get(problem.key)
    node = composed.config.get(problem.key) if problem.key else None
    if problem.check != "missing-value" or not option or not isinstance(node, DictConfig):
        return problem
    path = Path(config_dir, problem.key, f"{option}.yaml") if config_dir else None
    where = f" ({path})" if path is not None and path.is_file() else ""
    return dataclasses.replace(
        problem,
        message=f"the {problem.key} preset '{option}'{where} has no _block_, so it chooses no {problem.key} block",
        fix=f"add `_block_: <name>` to it ({problem.fix.split('=', 1)[-1]}), or choose another {problem.key} option",
    )


def refuse_interpolated_paths(config: DictConfig, blocks: Mapping[str, Block]) -> None:
    """Every import path the blocks name is written out in *config*, not read from the environment.

    Raises :class:`ConfigError` naming each path that is (directly, or passed on by another key).
    A composed config keeps ``${oc.env:...}`` values as interpolations (:mod:`blocks.core.secrets`),
    which each process resolves again when it builds the blocks: a path read from the environment
    would be checked here and imported there, from an environment that may differ.
    """
    from_env = {_key_of(path): raw for path, raw in env_interpolations(config).items()}
    problems = []
    for block in blocks.values():
        for key, _, _ in block.import_paths():
            raw = next((raw for at, raw in from_env.items() if _within(at, key)), None)
            problem = interpolated_path_problem(raw, key)
            if problem is not None:
                problems.append(problem)
    if problems:
        raise ConfigError(problems)


def _key_of(path: KeyPath) -> str:
    """The config key of a path of keys and list indices: ``("monitor", "loggers", 1)`` → ``monitor.loggers[1]``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path).lstrip(".")


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _without_failing(overrides: list[str], problems: Sequence[Problem]) -> list[str] | None:
    """*overrides* without those the problems name or lie under, or None if none is named.

    Under a named key: a failed group's keys, ``model.bar.x`` when ``model.bar`` is unknown.
    """
    failing = {p.key for p in problems if p.key}
    failing |= {key.split("[", 1)[0] for key in failing}
    kept = [o for o in overrides if not any(_within(_override_key(o), key) for key in failing)]
    return kept if len(kept) < len(overrides) else None


def _name_interpolating_override(error: ConfigError, overrides: Sequence[str]) -> ConfigError:
    """An interpolation error that names no key is about the override whose value interpolates."""
    interpolating = [o for o in overrides if "${" in o.split("=", 1)[-1]]
    if not interpolating or all(p.key for p in error.problems):
        return error
    key = _override_key(interpolating[0])
    problems = [
        p
        if p.key
        else Problem(
            key,
            f"{interpolating[0].split('=', 1)[1]} cannot be resolved: {p.message}",
            interpolation_fix(key, f"{interpolating[0]} {p.message}"),
            check="interpolation",
        )
        for p in error.problems
    ]
    return ConfigError(problems)


def _name_broken_recipe(error: ConfigError, overrides: Sequence[str]) -> ConfigError:
    """When the chosen recipe is missing because its file failed to load, say so and name the file."""
    if not any(problem.key == "recipe" for problem in error.problems):
        return error
    chosen = DEFAULT_RECIPE
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") == "recipe":
            chosen = value
    for broken in catalogs.load_problems():
        if chosen in broken.recipes:
            return ConfigError(
                Problem(
                    "recipe",
                    f"recipe '{chosen}' could not be loaded: {broken.where} raised {broken.message}",
                    f"correct {broken.path}, or choose another recipe",
                )
            )
    return error


KnownKeysMemo = dict[tuple[str | None, ...], dict[str, list[str]]]
"""The keys of each group for a set of group choices, kept for one :func:`compose` or :func:`plan` call."""


class _KnownKeys(Mapping[str, list[str]]):
    """Keys of each group's node when the overrides that set keys are left out (for did-you-mean).

    Composed on first use only: most errors never ask, and an unknown key asks once, with
    the same config search path as the job (*config_dir* and ``hydra.searchpath``), so a
    preset found there has its keys. *memo* shares the answer between the composing rounds
    of one call (each round drops the overrides that failed, so the group choices rarely
    change); nothing outlives the call, so a catalog that changes is always seen. A group
    is missing when the choices themselves do not compose.
    """

    def __init__(
        self, overrides: Sequence[str], memo: KnownKeysMemo | None = None, config_dir: str | None = None
    ) -> None:
        self._group_choices = tuple(o for o in overrides if _chooses_or_searches(o))
        self._config_dir = config_dir
        self._memo = memo if memo is not None else {}

    def _composed(self) -> dict[str, list[str]]:
        key = (self._config_dir, *self._group_choices)
        if key not in self._memo:
            try:
                cfg = _compose_raw(self._group_choices, self._config_dir)
            except Exception:
                cfg = DictConfig({})
            self._memo[key] = {
                str(group): field_keys(node)
                for group, node in cfg.items()
                if group != "hydra" and isinstance(node, DictConfig)
            }
        return self._memo[key]

    def __getitem__(self, group: str) -> list[str]:
        return self._composed()[group]

    def __iter__(self) -> Iterator[str]:
        return iter(self._composed())

    def __len__(self) -> int:
        return len(self._composed())


def plan_blocks(
    blocks: Mapping[str, Block],
    choices: Mapping[str, str] | None,
    environment: Environment | None = None,
    *,
    check_storage: bool = True,
    config: DictConfig | None = None,
) -> Plan:
    """The one way a job is planned, in three explicit steps: prepare, plan, preflight.

    Blocks from a package built for another block API are refused; the data prepares its
    inputs (I/O, e.g. ``data.source`` into the cache); :func:`~blocks.core.plan.make_plan`
    checks and derives (pure); then, with *check_storage*, the checks that read storage (the
    checkpoint to resume) add their problems. *config* is the config the blocks were built
    from: the plan shows the values it reads from the environment as their interpolation, and
    this process hides the secrets among them from here on, in the plan's problems too
    (:mod:`blocks.core.masking`).
    """
    packages.refuse_incompatible_blocks(blocks.values())
    data = blocks.get("data")
    if isinstance(data, DataBlock):
        data.prepare()
    plan = make_plan(blocks, choices, environment)
    if config is not None:
        from_environment = hide_environment_values(config)
        problems = tuple(
            dataclasses.replace(p, message=hidden(p.message), fix=hidden(p.fix)) for p in plan.problems
        )
        plan = dataclasses.replace(plan, from_environment=from_environment, problems=problems)
    return preflight(plan) if check_storage else plan


def plan_config(composed: Composed, environment: Environment | None = None) -> Plan:
    """The plan of a composed config."""
    return plan_blocks(
        config_to_blocks(composed.config), composed.choices, environment, config=composed.config
    )


def plan(
    overrides: Sequence[str] = (),
    environment: Environment | None = None,
    config_dir: str | None = None,
    *,
    catalog: Catalog | None = None,
) -> Plan:
    """Compose *overrides* (with ``--config-dir`` *config_dir*) from *catalog* and plan the result (torch-free).

    *catalog* defaults to the current one (:func:`blocks.core.catalog.current`). When some
    overrides do not compose, the ``ConfigError`` also carries the plan errors of the job
    without them, so one run shows every problem.
    """
    with (catalog or catalogs.current()).active():
        return plan_job(overrides, environment, config_dir)[2]


def plan_job(
    overrides: Sequence[str] = (),
    environment: Environment | None = None,
    config_dir: str | None = None,
    freeze: Freeze | None = None,
) -> tuple[Job, Composed, Plan]:
    """Compose *overrides* once and plan once: the job, the config planned (*freeze* applied) and its plan.

    The config planned is the composed job config, or what *freeze* makes of the job (the
    config the run will use). Problems are reported as :func:`plan` reports them.
    """
    step = functools.partial(_blocks_once, config_dir=config_dir, freeze=freeze, known={})
    built, problems = _collecting(overrides, step)
    if not problems:
        assert built is not None
        job, composed, blocks = built
        planned = plan_blocks(blocks, composed.choices, environment, config=composed.config)
        if launches_elsewhere(job.hydra_config):
            planned = dataclasses.replace(planned, problems=as_elsewhere(planned.problems))
        return job, composed, planned
    failed_groups = {p.key for p in problems if p.key and "." not in p.key}

    def independent(problem: Problem) -> bool:
        """Not about a group whose chosen option failed (the plan saw the default option instead)."""
        keys = (problem.key, *problem.related)
        return problem not in problems and not any(k.split(".", 1)[0] in failed_groups for k in keys)

    if built is not None:
        _, composed, blocks = built
        problems += [p for p in plan_blocks(blocks, composed.choices, environment).errors if independent(p)]
    raise ConfigError(problems)


def blocks_for(overrides: Sequence[str] = ()) -> dict[str, Block]:
    """The blocks *overrides* compose to, without planning."""
    return config_to_blocks(compose(overrides).config)


__all__ = [
    "BlocksError",
    "Composed",
    "Job",
    "blocks_for",
    "compose",
    "hydra_context",
    "plan",
    "plan_config",
    "plan_job",
]
