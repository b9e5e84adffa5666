"""Rendering plans, problems and block listings with rich (torch-free)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from blocks.core.masking import hidden
from blocks.core.packages import API_VERSION, package_of
from blocks.core.plan import MemoryEstimate, Plan, format_bytes
from blocks.spec.block import block_fields
from blocks.spec.errors import Problem
from blocks.spec.registry import Entry
from blocks.spec.values import json_value

_DERIVED_LABELS = {
    "accelerator": "accelerator",
    "world_size": "world size (devices × nodes)",
    "micro_batch": "micro-batch per device",
    "accumulate": "accumulate",
    "global_batch": "global batch (micro × data-parallel × accumulate)",
    "train_samples": "train samples",
    "val_samples": "val samples",
    "steps_per_epoch": "steps per epoch",
    "total_steps": "total steps",
    "total_tokens": "total tokens (steps × global batch × seq_len)",
    "epochs": "epochs",
    "warmup_steps": "warmup steps",
    "lr": "LR (optim.lr)",
    "effective_lr": "effective LR",
    "parameters": "model parameters",
}


def _changed_fields(plan: Plan, kind: str) -> str:
    """``name=value`` for the fields of block *kind* that differ from its class's defaults.

    A field that holds a value from the environment shows its interpolation text instead.
    """
    block = plan.blocks[kind]
    default = type(block)()
    from_environment = {path[1] for path in plan.from_environment if len(path) > 1 and path[0] == kind}
    shown = plan.shown_fields(kind) if from_environment else {}
    parts = [
        f"{f.name}={(shown[f.name] if f.name in from_environment else getattr(block, f.name))!r}"
        for f in dataclasses.fields(block)
        if getattr(block, f.name) != getattr(default, f.name)
    ]
    return " ".join(parts)


def _number(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def plan_panel(plan: Plan) -> Panel:
    """The plan as a rich panel: blocks, derived numbers, problems."""
    blocks = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    blocks.add_column("group")
    blocks.add_column("block")
    blocks.add_column("option")
    blocks.add_column("settings (non-default)", overflow="fold")
    for kind, block in plan.blocks.items():
        option = plan.choices.get(kind, block.block_name)
        cells = (
            kind,
            block.block_name,
            "" if option == block.block_name else option,
            _changed_fields(plan, kind),
        )
        blocks.add_row(*(Text(cell) for cell in cells))
    derived = Table(show_header=False, box=None, pad_edge=False)
    derived.add_column(style="cyan")
    derived.add_column(justify="right")
    values = dataclasses.asdict(plan.derived)
    for key, label in _DERIVED_LABELS.items():
        derived.add_row(label, _number(values[key]))
    parts: list[object] = [blocks, Text(""), derived]
    if plan.derived.memory is not None:
        parts += [Text(""), memory_table(plan.derived.memory)]
    if plan.problems:
        parts += [Text(""), problems_text(plan.problems)]
    status = "[green]valid[/]" if plan.ok else f"[red]{len(plan.errors)} error(s)[/]"
    title = f"plan: recipe [bold]{escape(plan.choices.get('recipe', '-'))}[/] — {status}"
    return Panel(Group(*parts), title=title, title_align="left")  # type: ignore[arg-type]


def memory_table(memory: MemoryEstimate) -> Table:
    """The memory estimate per device, by what holds it, against the device's memory."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="cyan")
    table.add_column(justify="right")
    layout = "sharded" if memory.sharded else "replicated"
    table.add_row(f"memory per device (estimate, {layout})", "")
    table.add_row("  parameters", format_bytes(memory.parameters))
    table.add_row("  gradients", format_bytes(memory.gradients))
    table.add_row("  optimizer state", format_bytes(memory.optimizer))
    checkpointing = ", recomputed" if memory.activation_checkpointing else ""
    activations = "unknown" if memory.activations is None else format_bytes(memory.activations)
    table.add_row(f"  activations (one micro-batch{checkpointing})", activations)
    table.add_row("  total", format_bytes(memory.total))
    if not memory.device:
        table.add_row("  device memory", "unknown (set trainer.device_memory_gb)")
    else:
        share = f"{memory.total / memory.device:.0%}"
        table.add_row(
            f"  device memory ({memory.device_source})", f"{format_bytes(memory.device)} ({share} used)"
        )
    return table


def problems_text(problems: Iterable[Problem]) -> Text:
    """Problems as coloured lines: ``error optim.lr: ...`` then the fix."""
    text = Text()
    for problem in problems:
        style = "bold red" if problem.is_error else "bold yellow"
        text.append(f"{problem.severity} ", style=style)
        if problem.key:
            text.append(f"{problem.key}: ", style="bold")
        text.append(hidden(problem.message) + "\n")  # before rich wraps it over lines
        if problem.fix:
            text.append(f"    fix: {hidden(problem.fix)}\n", style="dim")
    text.rstrip()
    return text


def print_problems(console: Console, problems: Iterable[Problem], *, header: str = "") -> None:
    """Print *problems* (to the console's stream) under an optional header."""
    if header:
        console.print(header, style="bold", highlight=False, markup=False)
    console.print(problems_text(problems), highlight=False)


def registry_table(entries: list[Entry]) -> Table:
    """Every block: kind, name, package, fields and the first line of its doc."""
    table = Table(show_header=True, header_style="bold", show_lines=True)
    table.add_column("kind")
    table.add_column("name", style="bold")
    table.add_column("package")
    table.add_column("fields (type = default)", overflow="fold")
    table.add_column("about", overflow="fold")
    for entry in entries:
        fields = "\n".join(f"{f.name}: {f.type} = {f.default!r}" for f in block_fields(entry.cls))
        package = entry.package + (f" {entry.version}" if entry.version else "")
        owner = package_of(entry)
        if owner is not None and not owner.compatible:
            package += f"\nINCOMPATIBLE: targets block API {owner.api}, this blocks has {API_VERSION}"
        cells = (entry.kind, entry.name, package, fields, entry.cls.summary())
        table.add_row(*(Text(cell) for cell in cells))  # Text: type names like tuple[int, ...] are not markup
    return table


def entry_json(entry: Entry) -> dict[str, object]:
    """A JSON-ready description of one registered block."""
    return {
        "kind": entry.kind,
        "name": entry.name,
        "package": entry.package,
        "version": entry.version,
        "compatible": owner.compatible if (owner := package_of(entry)) is not None else True,
        "doc": entry.cls.summary(),
        "fields": [
            {"name": f.name, "type": f.type, "default": json_value(f.default), "doc": f.doc}
            for f in block_fields(entry.cls)
        ],
    }


def options_table(options: dict[str, list[str]]) -> Table:
    """Every option of each config group (blocks, presets, recipes: blocks' own, packages', the project's)."""
    table = Table(show_header=True, header_style="bold", title="config groups", title_justify="left")
    table.add_column("group", style="bold")
    table.add_column("options (group=OPTION)", overflow="fold")
    for group, names in options.items():
        table.add_row(Text(group), Text(", ".join(names)))
    return table
