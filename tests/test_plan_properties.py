"""Property-based: any override combination either plans or ends in a ``BlocksError`` naming a key.

Planned on a CPU-only machine and on one with 8 GPUs (drawn).

Hypothesis draws overrides over every group (its options, a typo, a recipe preset) and every
key of every block of that group (values of the field's type, out-of-range values, values of
the wrong type, null). Nothing else may escape: no ``KeyError``, ``ZeroDivisionError`` or
``TypeError`` from a check. A tiny sample of valid drawn jobs also trains two steps.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blocks.core import catalog, jobs
from blocks.core.checks import GPU
from blocks.core.environment import Environment
from blocks.core.recipe import RECIPES
from blocks.spec.block import KINDS
from blocks.spec.errors import BlocksError
from tests.catalog_fixtures import fresh_catalog

catalog.load()

ENV = Environment(gpus=0, host_memory_bytes=16 * 2**30)
RECIPE_NAMES = sorted({e.name for e in RECIPES.entries()} | {"tiny_lm"})

CHOICES: dict[str, list[str]] = {
    "level": ["byte", "char", "word"],
    "schedule": ["cosine", "linear", "constant", "cosin"],
    "activation": ["relu", "gelu", "tanh", "silu", "relu6"],
    "accelerator": ["auto", "cpu", "gpu", "tpu"],
    "progress": ["auto", "bar", "lines", "off", "fancy"],
    "mode": ["min", "max", "best"],
    "lr_scaling": ["none", "linear", "sqrt", "cubic"],
    "backend": ["gloo", "nccl", "mpi", "ucc"],
    "resume": ["auto", "never", "", "/nonexistent/checkpoint"],
    "monitor": ["val/loss", "val/accuracy", "val/perplexity", "train/loss", "loss"],
    "path": ["", "/nonexistent/*.txt", "memory://empty/*.txt"],
    "dir": ["/tmp/blocks-property-checkpoints"],
}
"""Values for string fields, valid ones and near misses."""

INT_VALUES = st.one_of(st.integers(-2, 4), st.sampled_from([8, 16, 32, 64, 100, 128, 256, 1000, 4096, 10**6]))
FLOAT_VALUES = st.one_of(
    st.sampled_from([-1.0, 0.0, 1e-4, 0.01, 0.1, 0.5, 0.9, 0.999, 1.0, 1.5, 3.0, 80.0]),
    st.floats(-2, 2, allow_nan=False),
)


def _library_entries(kind: str) -> list[typing.Any]:
    """The library's own blocks of *kind*, not those other test modules register in this process."""
    return fresh_catalog().registry.entries(kind)


def _fields(kind: str) -> dict[str, typing.Any]:
    """Every field name of every block of *kind*, with its annotation (first block that has it)."""
    out: dict[str, typing.Any] = {}
    for entry in _library_entries(kind):
        hints = typing.get_type_hints(entry.cls)
        for f in dataclasses.fields(entry.cls):
            out.setdefault(f.name, hints[f.name])
    return out


FIELDS = {kind: _fields(kind) for kind in KINDS}


def _render(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_render(v) for v in value) + "]"
    if isinstance(value, str):
        return f"'{value}'"
    return repr(value)


def _values(name: str, annotation: typing.Any) -> st.SearchStrategy[str]:
    """Override values for a field: mostly of its type, sometimes null or of another type."""
    args = typing.get_args(annotation)
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args
    base = next((a for a in args if a is not type(None)), annotation) if optional else annotation
    if name in CHOICES:
        typed: st.SearchStrategy[object] = st.sampled_from(CHOICES[name])
    elif base is bool:
        typed = st.booleans()
    elif base is int:
        typed = INT_VALUES
    elif base is float:
        typed = FLOAT_VALUES
    elif typing.get_origin(base) is tuple:
        typed = st.lists(INT_VALUES, max_size=3)
    else:
        typed = st.text(alphabet="abc/*._-", max_size=8)
    wrong = st.sampled_from([None, "abc", 1.5, [1, 2]])
    return st.one_of(typed, typed, typed, wrong).map(_render)


@st.composite
def overrides(draw: st.DrawFn) -> list[str]:
    """A command line: a recipe, some group options, some keys."""
    out = [f"recipe={draw(st.sampled_from([*RECIPE_NAMES, 'charml']))}"]
    for kind in draw(st.lists(st.sampled_from(KINDS), unique=True, max_size=4)):
        options = [*(e.name for e in _library_entries(kind)), *RECIPE_NAMES, kind[:3] + "x"]
        out.append(f"{kind}={draw(st.sampled_from(options))}")
    keys = draw(
        st.lists(
            st.sampled_from([(kind, name) for kind in KINDS for name in FIELDS[kind]]),
            unique=True,
            max_size=6,
        )
    )
    for kind, name in keys:
        out.append(f"{kind}.{name}={draw(_values(name, FIELDS[kind][name]))}")
    if draw(st.booleans()):
        out.append(
            draw(st.sampled_from(["trainer.max_steps=3", "debug=fast", "+optim.nope=1", "traner.seed=1"]))
        )
    return out


def _assert_names_keys(problems: typing.Sequence[typing.Any], where: str) -> None:
    for problem in problems:
        assert problem.key, f"{where}: a problem names no key: {problem}"
        assert problem.check, f"{where}: a problem has no check name: {problem}"
        if problem.is_error:
            assert problem.fix, f"{where}: an error has no fix: {problem}"


EXAMPLES = int(os.environ.get("BLOCKS_PROPERTY_EXAMPLES", "45"))
"""Drawn override sets per run: each costs a composition per bad override (~0.5 s here); raise it to search longer."""


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
@pytest.mark.slow
@given(args=overrides(), env=st.sampled_from([ENV, GPU]))
def test_any_overrides_plan_or_fail_naming_a_key(
    args: list[str], env: Environment, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A drawn relative path (data.cache_dir='c-c.') is prepared into the working directory: not the checkout.
    here = os.getcwd()
    os.chdir(tmp_path_factory.getbasetemp())
    try:
        plan = jobs.plan(args, env)
    except BlocksError as error:
        assert error.problems
        _assert_names_keys(error.problems, " ".join(args))
        return
    finally:
        os.chdir(here)
    _assert_names_keys(plan.problems, " ".join(args))
    assert plan.derived.world_size >= 1
    plan.to_json()


SMALL = {
    "data.batch_size": st.sampled_from([1, 2, 4, 8]),
    "optim.lr": st.sampled_from([1e-3, 0.01, 0.1]),
    "optim.accumulate": st.sampled_from([1, 2]),
    "optim.schedule": st.sampled_from(["cosine", "linear", "constant"]),
    "optim.warmup_steps": st.sampled_from([0, 1, 5]),
    "optim.lr_scaling": st.sampled_from(["none", "linear", "sqrt"]),
    "precision": st.sampled_from(["32-true", "bf16-mixed", "bf16-true"]),
    "optim": st.sampled_from(["adamw", "sgd"]),
}


@st.composite
def small_jobs(draw: st.DrawFn) -> list[str]:
    """A valid job small enough to train two steps in a second or two."""
    out = [f"recipe={draw(st.sampled_from(['blobs', 'tiny_lm']))}"]
    for key in draw(st.lists(st.sampled_from(sorted(SMALL)), unique=True, max_size=4)):
        out.append(f"{key}={draw(SMALL[key])}")
    fixed = [
        "trainer.max_steps=2",
        "trainer.max_epochs=null",
        "monitor.progress=off",
        "checkpoint.enabled=false",
    ]
    return [*sorted(out, key=lambda o: "." in o), *fixed]


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(args=small_jobs())
def test_a_sample_of_planned_jobs_trains(args: list[str], tmp_path_factory: pytest.TempPathFactory) -> None:
    from blocks.launch.driver import run

    plan = jobs.plan(args, ENV)
    assert plan.ok, [p.render() for p in plan.errors]  # every small job is valid
    run_dir: Path = tmp_path_factory.mktemp("run")
    summary = run(args, run_dir)
    assert summary.status == "completed", summary
    assert summary.global_step == 2
