"""The options of every config group, for ``blocks list``, ``--help`` and shell completion.

Every source counts: registered blocks, presets that recipes make, YAML presets (blocks' own,
installed packages', the project's) and recipes, Python and YAML, pipelines included.
"""

from __future__ import annotations

from blocks.core.compose import GROUPS, group_options


def all_options() -> dict[str, list[str]]:
    """Each config group's options, by group in :data:`GROUPS` order (every recipe is called for its presets)."""
    from blocks.core import catalog
    from blocks.core.recipe import RECIPES

    catalog.register_configs()
    options = {group: group_options(group) for group in GROUPS}
    options["recipe"] = sorted({*options["recipe"], *(entry.name for entry in RECIPES.entries())})
    return options


def groups_help(command: str) -> str:
    """The ``--help`` text of ``blocks run``/``blocks plan`` that lists every group and its options."""
    lines = [
        "config groups (choose one option each: GROUP=OPTION; set a key: GROUP.KEY=VALUE):",
        "",
    ]
    for group, names in all_options().items():
        lines.append(f"  {group}: {', '.join(names) or '(none)'}")
    lines += [
        "",
        f"examples: blocks {command} recipe=digits_mlp optim.lr=1e-3",
        f"          blocks {command} recipe=blobs debug=fast optim=sgd",
        'a block\'s keys: blocks list KIND; completion: eval "$(blocks run -sc install=bash)"',
    ]
    return "\n".join(lines)
