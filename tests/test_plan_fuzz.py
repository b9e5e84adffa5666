"""Property: ``blocks plan`` survives hostile input (issue 14): extreme numbers and malformed overrides.

Hypothesis draws, for the numeric fields of every built-in block, the values that broke it
before (0, -1, 2**63, inf, nan, 1e308, -1e308) and overrides with broken syntax (stray ``=``,
brackets, quotes, ``${``, ``+``/``~`` prefixes). Each command line runs through the real CLI
entry in this process (``blocks.cli.main.run_captured``), rendered as a terminal sees it and
as ``--json``. It must exit 0 or 2, never print a traceback, never hang, and every error must
name a key or the override. ``tests/test_plan_properties.py`` covers ordinary values.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from blocks.cli.main import run_captured
from blocks.core import catalog
from blocks.spec.block import KINDS
from tests.catalog_fixtures import fresh_catalog
from tests.test_bad_input import hang_guard

catalog.load()

EXTREMES = ["0", "-1", str(2**63), "inf", "nan", "-inf", "1e308", "-1e308", "1e-308"]
RECIPES = ["charlm", "blobs", "digits_mlp", "tiny_lm"]


def _numeric(annotation: typing.Any) -> bool:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(a in (int, float) for a in args)
    return annotation in (int, float)


def _numeric_fields() -> list[tuple[str, str, str]]:
    """(kind, block, field) for every int or float field of every block the library ships."""
    out = []
    for kind in KINDS:
        for entry in fresh_catalog().registry.entries(kind):
            hints = typing.get_type_hints(entry.cls)
            out += [
                (kind, entry.name, f.name) for f in dataclasses.fields(entry.cls) if _numeric(hints[f.name])
            ]
    return out


NUMERIC = _numeric_fields()
JUNK = st.text(alphabet="=[]{}(),'\"$:~+ .*a1\\", max_size=6)
KEYS = st.sampled_from(
    sorted({f"{kind}.{name}" for kind, _, name in NUMERIC} | {"strategy", "foo", "hydra.job"})
)


@st.composite
def extreme_override(draw: st.DrawFn) -> list[str]:
    """A block chosen by name and one of its numeric fields set to an extreme value."""
    kind, block, name = draw(st.sampled_from(NUMERIC))
    return [f"{kind}={block}", f"{kind}.{name}={draw(st.sampled_from(EXTREMES))}"]


@st.composite
def malformed_override(draw: st.DrawFn) -> list[str]:
    """An override with broken syntax, or a well-formed one that no block reads."""
    key, junk = draw(KEYS), draw(JUNK)
    prefix = draw(st.sampled_from(["", "", "+", "++", "~"]))
    return [
        draw(
            st.sampled_from(
                [
                    f"{prefix}{key}={junk}",
                    f"{prefix}{junk}=1",
                    f"{prefix}{key}=={junk}",
                    f"{prefix}{key}{junk}",
                    f"{prefix}{key}=[{junk}]",
                    f"{prefix}{key}=${{{junk}}}",
                ]
            )
        )
    ]


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    """A recipe, then extreme values and malformed overrides in any order."""
    parts = draw(st.lists(st.one_of(extreme_override(), malformed_override()), min_size=1, max_size=3))
    args = ["-m"] if draw(st.integers(0, 3)) == 0 else []  # a sweep: every job is planned
    args += [f"recipe={draw(st.sampled_from(RECIPES))}"] if draw(st.booleans()) else []
    for part in parts:
        args += part
    return args


def _plan(args: list[str]) -> tuple[int, str]:
    with hang_guard(60):  # a guard against hangs (a divisor search ran for minutes), not a speed assertion
        code, output = run_captured(["plan", *args])
    assert "Traceback" not in output, output
    assert code in (0, 2), (code, output)
    return code, output


def _json_problems(output: str) -> list[dict[str, typing.Any]]:
    """The problems in the JSON ``plan --json`` printed (after any warnings on stderr), of every job."""
    starts = [i + 1 for i in range(len(output)) if output.startswith(("\n{", "\n["), i)]
    start = 0 if output.startswith(("{", "[")) else starts[0]
    payload = json.loads(output[start:])
    jobs = payload if isinstance(payload, list) else [payload]
    return [problem for job in jobs for problem in job["problems"]]


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
    # no shrinking: it takes minutes per failure, and a drawn command line is short already
    phases=(Phase.explicit, Phase.generate),
)
@given(command_lines())
def test_plan_never_crashes_and_names_a_key_in_every_error(args: list[str]) -> None:
    code, output = _plan(args)
    json_code, json_output = _plan(["--json", *args])
    assert json_code == code, (args, output, json_output)
    errors = [p for p in _json_problems(json_output) if p["severity"] == "error"]
    assert bool(errors) == (code == 2), (args, json_output)
    for problem in errors:
        assert problem["key"], f"{args}: an error names no key or override: {problem}"
        assert problem["fix"], f"{args}: an error has no fix: {problem}"
