"""mkdocs hook: generate the conflict tables from the checks themselves.

``docs/concepts.md`` holds the marker ``<!-- blocks-checks -->``; this hook replaces it, at
build time, with:

- which options of two groups combine, for the pairs that have contracts (each cell is the
  result of planning that combination: ✓, or the names of the checks that refuse it);
- every check of ``blocks.core.checks.CHECKS``: the blocks it relates, the key it reports,
  a command line that violates it, and the message and fix the plan prints for it (produced
  by planning that command line now).

So the tables show what the code does; the test suite plans the same examples
(``tests/test_contracts.py``) and fails when a check changes its name or key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mkdocs.exceptions import PluginError

PAGE = "concepts.md"
MARKER = "<!-- blocks-checks -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **_: Any) -> str:
    """Replace the marker on the concepts page with the generated tables."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"{PAGE} must contain the line {MARKER!r}; the hook puts the check tables there")
    return markdown.replace(MARKER, render_checks())


def render_checks() -> str:
    """The compatibility matrices and the table of every check."""
    from blocks.core import catalog

    catalog.load()
    return "\n\n".join([_matrices(), _check_tables()]) + "\n"


# --- which options combine -------------------------------------------------------------------

Overrides = Callable[[str, str], list[str]]


def _strategy_precision(strategy: str, precision: str) -> list[str]:
    devices = "1" if strategy == "single" else "2"
    return [
        f"strategy={strategy}",
        f"trainer.devices={devices}",
        f"precision={precision}",
        "trainer.accelerator=gpu",
    ]


def _strategy_model(strategy: str, model: str) -> list[str]:
    devices = "1" if strategy == "single" else "2"
    recipe = "blobs" if model == "mlp" else "charlm"
    return [f"recipe={recipe}", f"model={model}", f"strategy={strategy}", f"trainer.devices={devices}"]


def _precision_accelerator(precision: str, accelerator: str) -> list[str]:
    return [f"precision={precision}", f"trainer.accelerator={accelerator}"]


def _model_data(model: str, data: str) -> list[str]:
    task = "lm" if data == "text" else "classify"
    return [f"data={data}", f"model={model}", f"task={task}"]


MATRICES: list[tuple[str, str, list[str] | None, Overrides]] = [
    ("strategy", "precision", None, _strategy_precision),
    ("strategy", "model", None, _strategy_model),
    ("precision", "accelerator", ["cpu", "gpu"], _precision_accelerator),
    ("model", "data", None, _model_data),
]
"""(row group, column group, column options (None: the group's blocks), overrides of a cell)."""


def _cell(overrides: list[str]) -> str:
    from blocks.core.checks import GPU
    from blocks.core.jobs import plan
    from blocks.spec.errors import BlocksError

    try:
        problems = plan(overrides, GPU).errors
    except BlocksError as error:
        problems = error.problems
    names = sorted({p.check for p in problems})
    return "✓" if not names else ", ".join(f"[`{n}`](#check-{n})" for n in names)


def _matrices() -> str:
    from blocks.spec.registry import REGISTRY

    parts = [
        "#### Which options combine",
        "",
        "Each cell is the plan of that combination (on a machine with GPUs; several processes "
        "for `ddp` and `fsdp`): ✓ when it is valid, else the checks that refuse it.",
    ]
    for rows_group, columns_group, columns, overrides in MATRICES:
        rows = REGISTRY.names(rows_group)
        cols = columns if columns is not None else REGISTRY.names(columns_group)
        header = f"| {rows_group} \\\\ {columns_group} | " + " | ".join(f"`{c}`" for c in cols) + " |"
        lines = [header, "|---|" + "---|" * len(cols)]
        for row in rows:
            cells = [_cell(overrides(row, col)) for col in cols]
            lines.append(f"| `{row}` | " + " | ".join(cells) + " |")
        parts += ["", "\n".join(lines)]
    return "\n".join(parts)


# --- every check -------------------------------------------------------------------------------


def _check_tables() -> str:
    from blocks.core.checks import CHECKS

    sections = [
        ("Contracts between blocks", [c for c in CHECKS if c.contract]),
        ("Checks of one block", [c for c in CHECKS if not c.contract and c.blocks != ("config",)]),
        (
            "Composition errors (Hydra and OmegaConf, rewritten)",
            [c for c in CHECKS if c.blocks == ("config",)],
        ),
    ]
    parts = []
    for title, checks in sections:
        lines = [
            f"#### {title}",
            "",
            "| check | blocks | key | violated by | the plan says |",
            "|---|---|---|---|---|",
        ]
        lines += [_check_row(check) for check in checks]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _check_row(check: Any) -> str:
    from blocks.core.checks import triggered

    example = " ".join(check.example)
    if not check.example:
        said = _escape(check.about)
        shown = "(a recipe file that raises)"
    else:
        problem = triggered(check)
        if problem is None:
            raise PluginError(f"check {check.name}: its example {example!r} does not trigger it")
        severity = "warning: " if not problem.is_error else ""
        said = _escape(f"{severity}{problem.message}") + "<br>fix: " + _escape(problem.fix)
        shown = f"`{example}`"
    blocks = ", ".join(check.blocks)
    return f'| <span id="check-{check.name}"></span>`{check.name}` | {blocks} | `{check.key}` | {shown} | {said} |'


def _escape(text: str) -> str:
    """Text for a Markdown table cell: pipes, HTML and backticks neutralized."""
    return (
        text.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("|", "\\|")
        .replace("`", "")
        .replace("\n", " ")
        .replace("$", "&#36;")
        .replace("*", "\\*")
        .replace("_", "\\_")
    )
