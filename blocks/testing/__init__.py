"""The conformance kit: checks a team runs against its blocks before sharing them.

Each check takes a block by kind and registered name (``"model", "acme/resnet"``) and raises
:class:`ConformanceError` saying what the block must fix. The checks:

* :func:`check_config_round_trip`: dataclass → YAML → dataclass, and every field overridden
  on the command line, give back the same block;
* :func:`check_plan`: the block plans inside a minimal recipe (a built-in one, or one of its
  package's recipes) without errors;
* :func:`check_split_sizes`: a data block's datasets are as long as its ``num_samples`` says;
* :func:`check_training`: a few real optimizer steps on CPU (``blocks run`` in a subprocess,
  or in this process), with finite losses, and a checkpoint round trip (the run extended from
  its checkpoint);
* :func:`check_ddp`: the same with ``strategy=ddp`` on 2 processes;
* :func:`check_listing`: ``blocks list`` renders it (docs for the block and its fields) and
  loading the catalog does not import torch.

:func:`check_block` runs them all. With pytest, the ``blocks_kit`` fixture (this package's
pytest plugin) runs them in a temporary directory::

    def test_my_model(blocks_kit):
        blocks_kit.check_block("model", "acme/resnet")
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import subprocess
import sys
import traceback
from collections.abc import Sequence, Sized
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from blocks.checkpoint import store
from blocks.core import catalog, jobs
from blocks.core.block_errors import raised_at
from blocks.core.compose import block_node, config_to_blocks, node_to_block
from blocks.core.plan import Plan
from blocks.core.recipe import RECIPES
from blocks.data.base import SPLITS
from blocks.spec.block import Block, block_fields
from blocks.spec.errors import BlocksError
from blocks.spec.registry import REGISTRY, Entry

BUILTIN_RECIPES = ("blobs", "charlm", "diabetes_mlp")
"""Minimal recipes tried, after the block's own package's recipes, to host a block."""

FEW_STEPS = ("trainer.max_epochs=null", "trainer.val_every=null", "monitor.log_every_n_steps=1")


class ConformanceError(AssertionError):
    """A block broke a rule of the kit; the message says which and what to change."""


@dataclass(frozen=True)
class Hosted:
    """A block placed in a recipe that plans: the overrides that compose it, and its plan."""

    overrides: tuple[str, ...]
    plan: Plan


def _entry(kind: str, name: str) -> Entry:
    catalog.load()
    try:
        return REGISTRY.get(kind, name)
    except BlocksError as exc:
        raise ConformanceError(
            f"{kind} block '{name}' is not registered: {exc}. Decorate the class with @register(...) and make "
            f"sure the package's entry point module imports it"
        ) from None


def _override_value(value: Any) -> str:
    """*value* in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_override_value(v)}" for k, v in value.items()) + "}"
    raise ConformanceError(f"a field holds {type(value).__name__}, which is not a config type")


def check_config_round_trip(kind: str, name: str, overrides: Sequence[str] = ()) -> None:
    """The block survives dataclass → YAML → dataclass, and every field overridden on the command line.

    The block is taken as a minimal recipe composes it with *overrides* (which fill the fields
    that have no usable default, like an adapter's ``target``).
    """
    args, block = _composed(kind, name, overrides)
    try:
        text = OmegaConf.to_yaml(block_node(block))
        node = OmegaConf.create(text)
        assert isinstance(node, DictConfig)
        back = node_to_block(kind, node)
    except Exception as exc:
        raise ConformanceError(
            f"{kind}={name} cannot go through YAML: {exc}. Use field types a config can hold (int, float, str, "
            f"bool, None, tuple/list and dict of those) and give every field a default"
        ) from None
    if back != block:
        raise ConformanceError(
            f"{kind}={name} changes when read back from YAML: {block!r} became {back!r}. Do not transform "
            f"fields in __post_init__, and annotate each field with the type of its default"
        )
    field_overrides = [f"{kind}.{f.name}={_override_value(getattr(block, f.name))}" for f in fields(block)]
    try:
        composed = config_to_blocks(jobs.compose([*args, *field_overrides]).config)[kind]
    except BlocksError as exc:
        raise ConformanceError(
            f"{kind}={name}: overriding each field with its own value on the command line failed:\n{exc}\n"
            f"every field must accept its own value as an override ({kind}.<field>=<value>)"
        ) from None
    if composed != block:
        raise ConformanceError(
            f"{kind}={name} is not the same block after overriding every field with its own value: "
            f"{block!r} became {composed!r}"
        )


def _candidates(name: str, recipe: str | None) -> list[str]:
    if recipe:
        return [recipe]
    namespace = name.split("/", 1)[0] if "/" in name else None
    own = [e.name for e in RECIPES.entries() if namespace and e.name.startswith(namespace + "/")]
    return [*own, *BUILTIN_RECIPES]


def _composed(kind: str, name: str, overrides: Sequence[str]) -> tuple[tuple[str, ...], Block]:
    """The block as the first minimal recipe composes it (planned or not), and the overrides used."""
    _entry(kind, name)
    errors = []
    for candidate in _candidates(name, None):
        args = (f"recipe={candidate}", f"{kind}={name}", *overrides)
        try:
            return args, config_to_blocks(jobs.compose(args).config)[kind]
        except BlocksError as exc:
            errors.append(f"  recipe={candidate}: {exc}")
    raise ConformanceError(f"{kind}={name} does not compose:\n" + "\n".join(errors))


def host(kind: str, name: str, overrides: Sequence[str] = (), recipe: str | None = None) -> Hosted:
    """The first minimal recipe in which ``kind=name`` plans without errors (the package's own first)."""
    _entry(kind, name)
    namespace = name.split("/", 1)[0] if "/" in name else None
    failures = []
    for candidate in _candidates(name, recipe):
        args = (f"recipe={candidate}", f"{kind}={name}", *overrides)
        try:
            plan = jobs.plan(args)
        except BlocksError as exc:
            failures.append(f"  recipe={candidate}: {exc}")
            continue
        except Exception as exc:
            failures.append(
                f"  recipe={candidate}: planning raised {raised_at(exc)} (plan-time methods such as num_parameters must be implemented "
                f"torch-free; raise ValueError when a number cannot be known)"
            )
            continue
        if plan.ok:
            return Hosted(args, plan)
        failures.append(f"  recipe={candidate}: " + "; ".join(p.render() for p in plan.errors))
    raise ConformanceError(
        f"{kind}={name} plans in none of the minimal recipes:\n"
        + "\n".join(failures)
        + f"\nmake the block's check() accept a standard composition, give the kit the overrides it needs, "
        f"or ship a recipe in the {namespace or 'block'}'s package that uses it"
    )


def check_plan(kind: str, name: str, overrides: Sequence[str] = (), recipe: str | None = None) -> Plan:
    """The block plans inside a minimal recipe, with the derived numbers filled in."""
    plan = host(kind, name, overrides, recipe).plan
    chosen = plan.blocks[kind]
    if chosen.block_name != name:
        raise ConformanceError(f"{kind}={name} composed to {chosen.block_name}: check the registered name")
    if plan.derived.train_samples == 0 and kind == "data":
        raise ConformanceError(f"data={name} reports 0 train samples: num_samples('train') must count them")
    return plan


def check_split_sizes(name: str, overrides: Sequence[str] = (), recipe: str | None = None) -> dict[str, int]:
    """``data=name``'s ``build(split)`` has ``num_samples(split)`` samples, for every split it declares.

    The plan counts epochs, steps and the LR schedule with ``num_samples``; the loaders read the
    datasets. A run refuses a mismatch when it builds the data (a dataset without a length, an
    iterable stream, is not checked). Returns the sizes by split.
    """
    data = host("data", name, overrides, recipe).plan.blocks["data"]
    data.prepare_node()  # type: ignore[attr-defined]
    sizes = {}
    for split in SPLITS:
        declared = data.num_samples(split)  # type: ignore[attr-defined]
        if declared < 0:
            raise ConformanceError(
                f"data={name}: num_samples({split!r}) is {declared}; count the samples (0: no such split)"
            )
        if declared == 0:
            continue
        dataset = data.build(split)  # type: ignore[attr-defined]
        if isinstance(dataset, Sized) and len(dataset) != declared:
            raise ConformanceError(
                f"data={name}: num_samples({split!r}) is {declared} but build({split!r}) returns a dataset of "
                f"{len(dataset)}; the plan's epochs and schedule count with num_samples, so they must agree"
            )
        sizes[split] = declared
    return sizes


def _run(args: Sequence[str], workdir: Path, timeout: float, in_process: bool = False) -> dict[str, Any]:
    """``blocks run ARGS`` from *workdir*, in a subprocess or (*in_process*) in this one; the run dir's summary."""
    run_dir = Path(next(a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")))
    if in_process:
        returncode, output = _run_here(
            [a for a in args if not a.startswith("hydra.run.dir=")], run_dir, workdir
        )
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "blocks", "run", *args],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
        )
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    if returncode != 0 or summary.get("status") != "completed":
        raise ConformanceError(
            f"`blocks run {' '.join(args)}` did not complete (exit {returncode}, "
            f"status {summary.get('status')!r}, reason {summary.get('reason')!r}). Its output ends with:\n"
            f"{output[-4000:]}\nthe block's build() must make objects that train in a standard Lightning loop"
        )
    return summary


def _run_here(args: Sequence[str], run_dir: Path, workdir: Path) -> tuple[int, str]:
    """The Python ``blocks run`` (:func:`blocks.launch.driver.run`) from *workdir*: an exit status and an error."""
    from blocks.launch.driver import run

    here = os.getcwd()
    os.chdir(workdir)
    try:
        run(list(args), run_dir)
    except BlocksError as error:
        return 2, str(error)
    except Exception:  # a block's build() or step raised: the kit reports it, as a subprocess's stderr would
        return 1, traceback.format_exc()
    finally:
        os.chdir(here)
    return 0, ""


def _finite_loss(summary: dict[str, Any], what: str) -> None:
    loss = summary.get("metrics", {}).get("train/loss")
    if loss is None or not math.isfinite(loss):
        raise ConformanceError(
            f"{what}: the training loss is {loss!r}; the model's outputs must give a finite loss"
        )


def check_training(
    kind: str,
    name: str,
    workdir: Path,
    overrides: Sequence[str] = (),
    recipe: str | None = None,
    steps: int = 2,
    timeout: float = 300,
    in_process: bool = False,
) -> dict[str, Any]:
    """A few real optimizer steps on CPU, and the same run resumed halfway from its checkpoint, exactly.

    The run trains ``2 * steps`` steps straight, saving a checkpoint at *steps*; a second run
    resumes from that checkpoint and trains the rest. Its losses at every step and its final
    weights must be those of the straight run, bit for bit: what the checkpoint does not hold
    (a buffer registered with ``persistent=False``, random numbers drawn outside torch's
    generator, state kept on the side) shows up as a difference.

    Each run is ``blocks run`` in a subprocess (killed after *timeout* seconds), or with
    *in_process* :func:`blocks.launch.driver.run` in this process, without the ~8 s each
    process spends importing torch and Lightning: for a suite that checks many blocks. A
    subprocess also contains a block that crashes its process or leaves global state behind.
    Returns the resumed run's summary.
    """
    hosted = host(kind, name, overrides, recipe)
    slug = f"{kind}-{name.replace('/', '-')}"
    straight_dir, resumed_dir = workdir / f"train-{slug}", workdir / f"train-{slug}-resumed"
    args = [
        *hosted.overrides,
        *FEW_STEPS,
        "trainer.accelerator=cpu",
        f"trainer.max_steps={2 * steps}",
        f"checkpoint.every_n_steps={steps}",
    ]
    straight = _run(
        [*args, "checkpoint.keep_last=3", f"hydra.run.dir={straight_dir}"], workdir, timeout, in_process
    )
    if straight["global_step"] != 2 * steps:
        raise ConformanceError(f"{kind}={name} trained {straight['global_step']} steps, not {2 * steps}")
    _finite_loss(straight, f"{kind}={name}")
    halfway = [c.url for c in store.scan(str(straight_dir / "checkpoints"))[0] if c.manifest.step == steps]
    if not halfway:
        raise ConformanceError(
            f"{kind}={name}: the run saved no checkpoint at step {steps} in {straight_dir}"
        )
    resumed = _run(
        [*args, f"checkpoint.resume={halfway[0]}", f"hydra.run.dir={resumed_dir}"],
        workdir,
        timeout,
        in_process,
    )
    if resumed.get("resumed_from") != halfway[0] or resumed["global_step"] != 2 * steps:
        raise ConformanceError(
            f"{kind}={name}: the run did not resume from its checkpoint at step {steps} "
            f"(resumed_from={resumed.get('resumed_from')!r}, step {resumed['global_step']}); "
            f"the built module's state_dict must load back into a freshly built one"
        )
    _same_training(f"{kind}={name}", straight_dir, straight, resumed_dir, resumed, steps)
    return resumed


def _losses(run_dir: Path) -> dict[int, str]:
    """``train/loss`` at each step of *run_dir*'s ``metrics.csv``, as written."""
    with (run_dir / "metrics.csv").open(newline="") as fh:
        return {int(row["step"]): row["train/loss"] for row in csv.DictReader(fh) if row.get("train/loss")}


def _same_training(
    what: str,
    straight_dir: Path,
    straight: dict[str, Any],
    resumed_dir: Path,
    resumed: dict[str, Any],
    steps: int,
) -> None:
    """The resumed run's losses after step *steps* and final weights are the straight run's."""
    hint = (
        "Resuming must continue exactly: keep all training state in the module's state_dict (not in a "
        "buffer registered with persistent=False or an attribute), and draw random numbers from torch's "
        "generator (not Python's random or numpy's)"
    )
    want, got = _losses(straight_dir), _losses(resumed_dir)
    for step in sorted(s for s in want if s > steps):
        if got.get(step) != want[step]:
            raise ConformanceError(
                f"{what}: resumed from its checkpoint at step {steps}, the run trains differently from the same "
                f"run uninterrupted: at step {step} train/loss is {got.get(step)} resumed, {want[step]} straight. "
                f"The checkpoint does not hold some state the training depends on. {hint}"
            )
    if straight.get("state_digest") != resumed.get("state_digest"):
        raise ConformanceError(
            f"{what}: resumed from its checkpoint at step {steps}, the run ends with other weights than the same "
            f"run uninterrupted (state_digest {resumed.get('state_digest')} resumed, "
            f"{straight.get('state_digest')} straight). {hint}"
        )


def check_ddp(
    kind: str,
    name: str,
    workdir: Path,
    overrides: Sequence[str] = (),
    recipe: str | None = None,
    steps: int = 2,
    timeout: float = 300,
) -> dict[str, Any]:
    """A few steps with ``strategy=ddp`` on 2 CPU processes."""
    ddp = ["strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu"]
    if kind == "strategy":
        ddp = ddp[1:]
    hosted = host(kind, name, [*ddp, *overrides], recipe)
    run_dir = workdir / f"ddp-{kind}-{name.replace('/', '-')}"
    summary = _run(
        [*hosted.overrides, *FEW_STEPS, f"trainer.max_steps={steps}", f"hydra.run.dir={run_dir}"],
        workdir,
        timeout,
    )
    if summary["world_size"] != 2:
        raise ConformanceError(f"{kind}={name}: the DDP run had world size {summary['world_size']}, not 2")
    _finite_loss(summary, f"{kind}={name} under DDP")
    return summary


def check_listing(kind: str, name: str) -> str:
    """``blocks list`` shows the block with its package, docs and fields; the catalog loads without torch."""
    from rich.console import Console

    from blocks.cli.render import entry_json, registry_table

    entry = _entry(kind, name)
    if not entry.cls.summary():
        raise ConformanceError(
            f"{entry.cls.__qualname__} has no docstring: its first line is what `blocks list` shows about {name}"
        )
    undocumented = [f.name for f in block_fields(entry.cls) if not f.doc]
    if undocumented:
        raise ConformanceError(
            f"{entry.cls.__qualname__} does not document {', '.join(undocumented)}: add them to the "
            f"'Attributes:' section of its docstring (`blocks list` and the docs show them)"
        )
    try:
        json.dumps(entry_json(entry))
    except TypeError as exc:
        raise ConformanceError(
            f"`blocks list --json` cannot write {entry.cls.__qualname__}'s defaults: {exc}. Use field types a "
            f"config can hold (int, float, str, bool, None, Enum, Path, tuple/list and dict of those)"
        ) from None
    console = Console(record=True, width=200, file=open(os.devnull, "w"))  # noqa: SIM115 - closed below
    console.print(registry_table([entry]))
    console.file.close()
    text = console.export_text()
    if name not in text or entry.package not in text:
        raise ConformanceError(f"`blocks list` does not show {kind}={name} from {entry.package}:\n{text}")
    _catalog_is_torch_free()
    return text


@functools.cache
def _catalog_is_torch_free() -> None:
    """Load the catalog (every installed package) in a fresh process and check torch stayed out."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from blocks.core import catalog; catalog.load(); print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.stdout.strip() != "False":
        raise ConformanceError(
            "loading the catalog imported torch (or failed): `blocks list` and `blocks plan` must stay torch-free. "
            "Import torch inside build() methods, not at the top of block modules.\n" + probe.stderr[-2000:]
        )


def check_block(
    kind: str,
    name: str,
    workdir: Path,
    overrides: Sequence[str] = (),
    recipe: str | None = None,
    ddp: bool = True,
    in_process: bool = False,
) -> None:
    """Every check of the kit for one block (*in_process*: see :func:`check_training`)."""
    check_config_round_trip(kind, name, overrides)
    check_plan(kind, name, overrides, recipe)
    if kind == "data":
        check_split_sizes(name, overrides, recipe)
    check_listing(kind, name)
    check_training(kind, name, workdir, overrides, recipe, in_process=in_process)
    if ddp:
        check_ddp(kind, name, workdir, overrides, recipe)


@dataclass(frozen=True)
class Kit:
    """The checks bound to a working directory (what the ``blocks_kit`` fixture gives a test).

    Attributes:
        workdir: where the checks' runs write their run dirs.
        in_process: :func:`check_training` trains in this process instead of in ``blocks run``
            subprocesses (the pytest ini option ``blocks_kit_in_process = true``).
    """

    workdir: Path
    in_process: bool = False

    def check_config_round_trip(self, kind: str, name: str, overrides: Sequence[str] = ()) -> None:
        """See :func:`check_config_round_trip`."""
        check_config_round_trip(kind, name, overrides)

    def check_plan(
        self, kind: str, name: str, overrides: Sequence[str] = (), recipe: str | None = None
    ) -> Plan:
        """See :func:`check_plan`."""
        return check_plan(kind, name, overrides, recipe)

    def check_training(
        self, kind: str, name: str, overrides: Sequence[str] = (), recipe: str | None = None
    ) -> None:
        """See :func:`check_training`."""
        check_training(kind, name, self.workdir, overrides, recipe, in_process=self.in_process)

    def check_ddp(
        self, kind: str, name: str, overrides: Sequence[str] = (), recipe: str | None = None
    ) -> None:
        """See :func:`check_ddp`."""
        check_ddp(kind, name, self.workdir, overrides, recipe)

    def check_listing(self, kind: str, name: str) -> str:
        """See :func:`check_listing`."""
        return check_listing(kind, name)

    def check_split_sizes(
        self, name: str, overrides: Sequence[str] = (), recipe: str | None = None
    ) -> dict[str, int]:
        """See :func:`check_split_sizes`."""
        return check_split_sizes(name, overrides, recipe)

    def check_block(
        self, kind: str, name: str, overrides: Sequence[str] = (), recipe: str | None = None, ddp: bool = True
    ) -> None:
        """See :func:`check_block`."""
        check_block(kind, name, self.workdir, overrides, recipe, ddp, in_process=self.in_process)


__all__ = [
    "ConformanceError",
    "Kit",
    "check_block",
    "check_config_round_trip",
    "check_ddp",
    "check_listing",
    "check_plan",
    "check_split_sizes",
    "check_training",
    "host",
]
