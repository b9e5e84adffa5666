"""mkdocs hook: generate the block and recipe reference from the registry.

``docs/reference/blocks.md`` holds a short hand-written introduction and the marker
``<!-- blocks-reference -->``; this hook replaces the marker, at build time, with one table per
registered block (fields, types, defaults, docs), the recipe presets of each group, every
Python recipe and every YAML preset. The page is rendered from the same objects that
``blocks list`` reads (``blocks.core.catalog.load()``, ``REGISTRY.entries()``,
``block_fields(cls)``, ``cls.summary()``, ``RECIPES.entries()``), so it cannot drift from the
code.

Registered in ``mkdocs.yml`` under ``hooks:``. The registry is loaded once per process:
restart ``mkdocs serve`` to see changes to blocks or recipes.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

PAGE = "reference/blocks.md"
MARKER = "<!-- blocks-reference -->"


def _about(kind: str) -> str:
    from blocks.spec.kinds import BY_NAME

    return BY_NAME[kind].doc


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **_: Any) -> str:
    """Replace the marker on the reference page with the generated reference."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"{PAGE} must contain the line {MARKER!r}; the hook puts the reference there")
    return markdown.replace(MARKER, render_reference())


# --- rendering -------------------------------------------------------------------------------


def render_reference() -> str:
    """The Markdown of every kind's blocks, the recipes and the YAML presets."""
    from blocks.core import catalog
    from blocks.spec.block import KINDS

    catalog.load()
    parts = [_kinds_overview()]
    for kind in KINDS:
        parts.append(_kind_section(kind))
    parts.append(_recipes_section())
    parts.append(_presets_section())
    return "\n\n".join(parts) + "\n"


def _kinds_overview() -> str:
    from blocks.core.compose import GROUP_DEFAULTS
    from blocks.spec.block import KINDS
    from blocks.spec.registry import REGISTRY

    rows = ["| kind | what | default option | options |", "|---|---|---|---|"]
    for kind in KINDS:
        options = ", ".join(f"[`{e.name}`](#{_anchor(kind, e.name)})" for e in REGISTRY.entries(kind))
        rows.append(f"| [{kind}](#{kind}) | {_about(kind)} | {_default(kind, GROUP_DEFAULTS)} | {options} |")
    return "## Kinds\n\n" + "\n".join(rows)


def _default(kind: str, defaults: dict[str, str]) -> str:
    value = defaults.get(kind, "???")
    return "set by the recipe" if value == "???" else f"`{value}`"


def _kind_section(kind: str) -> str:
    from blocks.core.compose import GROUP_DEFAULTS
    from blocks.core.plan import KIND_BASES
    from blocks.spec.registry import REGISTRY

    base = KIND_BASES[kind]
    lines = [
        f"## {kind} {{#{kind}}}",
        "",
        f"{_sentence(_about(kind))}. Base class `{base.__module__}.{base.__qualname__}`; "
        f"default option: {_default(kind, GROUP_DEFAULTS)}.",
    ]
    presets = _recipe_presets().get(kind, [])
    if presets:
        listed = ", ".join(f"`{kind}={recipe}` ({block})" for recipe, block in presets)
        lines += ["", f"Recipe presets in this group (see [Recipes](#recipes)): {listed}."]
    for entry in REGISTRY.entries(kind):
        lines += ["", _block_section(entry)]
    return "\n".join(lines)


def _block_section(entry: Any) -> str:
    from blocks.spec.block import block_fields

    cls = entry.cls
    package = entry.package + (f" {entry.version}" if entry.version else "")
    lines = [
        f"### `{entry.kind}={entry.name}` {{#{_anchor(entry.kind, entry.name)}}}",
        "",
        _rst(cls.summary()),
    ]
    body = _description(cls)
    if body:
        lines += ["", body]
    lines += ["", f"Class `{cls.__module__}.{cls.__qualname__}`, package `{package}`."]
    fields = block_fields(cls)
    if not fields:
        lines += ["", "No fields."]
        return "\n".join(lines)
    lines += ["", "| field | type | default | doc |", "|---|---|---|---|"]
    for f in fields:
        lines.append(
            f"| `{entry.kind}.{f.name}` | {_code(f.type)} | {_code(_value(f.default))} | {_cell(_rst(f.doc))} |"
        )
    return "\n".join(lines)


def _description(cls: type) -> str:
    """The docstring between its first line and its ``Attributes:`` section."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    paragraphs = doc.split("\n\n")[1:]
    kept = []
    for paragraph in paragraphs:
        if paragraph.lstrip().startswith(("Attributes:", "Args:")):
            break
        kept.append(" ".join(line.strip() for line in paragraph.splitlines()))
    return _rst("\n\n".join(kept))


def _recipe_presets() -> dict[str, list[tuple[str, str]]]:
    """Kind → (recipe name, block name) for every block a recipe customizes."""
    from blocks.core.recipe import RECIPES

    presets: dict[str, list[tuple[str, str]]] = {}
    for entry in RECIPES.entries():
        if entry.pipeline() is not None:
            continue
        for kind, block in entry.build().blocks().items():
            if block != type(block)():
                presets.setdefault(kind, []).append((entry.name, block.block_name))
    return presets


def _recipes_section() -> str:
    from blocks.core.compose import DEFAULT_RECIPE, GROUP_DEFAULTS
    from blocks.core.recipe import RECIPES
    from blocks.spec.block import KINDS

    lines = [
        "## Recipes {#recipes}",
        "",
        "Python recipes (`@recipe(...)` functions in `recipes/`); each is an option of the `recipe` "
        f"group. The default is `recipe={DEFAULT_RECIPE}`. A block a recipe customizes is the "
        "group option named after the recipe (the *option* column); the others are plain block "
        "options.",
    ]
    yaml_recipes = _yaml_files("recipe")
    if yaml_recipes:
        listed = ", ".join(
            f"[`recipe={path.stem}`](#{_anchor('recipe', path.stem)})" for path in yaml_recipes
        )
        lines += ["", f"YAML recipes are listed under [YAML presets](#yaml-presets): {listed}."]
    for entry in RECIPES.entries():
        pipeline = entry.pipeline()
        if pipeline is not None:
            lines += ["", *_pipeline_lines(entry, pipeline)]
            continue
        recipe = entry.build()
        chosen = recipe.blocks()
        lines += [
            "",
            f"### `recipe={entry.name}` {{#recipe-{_slug(entry.name)}}}",
            "",
            _rst(entry.summary),
            "",
            f"Defined by `{_source(entry.fn)}`, package `{entry.package}`.",
            "",
            "| kind | option | block | settings (non-default) |",
            "|---|---|---|---|",
        ]
        for kind in KINDS:
            block = chosen.get(kind)
            if block is None:
                default = GROUP_DEFAULTS.get(kind, "???")
                lines.append(
                    f"| {kind} | `{default}` | [`{default}`](#{_anchor(kind, default)}) | (group default) |"
                )
                continue
            customized = block != type(block)()
            option = entry.name if customized else block.block_name
            settings = _changed(block)
            lines.append(
                f"| {kind} | `{option}` | [`{block.block_name}`](#{_anchor(kind, block.block_name)}) "
                f"| {_cell(settings) if settings else ''} |"
            )
    return "\n".join(lines)


def _pipeline_lines(entry: Any, pipeline: Any) -> list[str]:
    """A pipeline recipe: its stages in order (see the Recipes guide, Pipelines of stages)."""
    lines = [
        f"### `recipe={entry.name}` {{#recipe-{_slug(entry.name)}}}",
        "",
        _rst(entry.summary),
        "",
        f"Defined by `{_source(entry.fn)}`, package `{entry.package}`. A pipeline: "
        "`blocks run` runs its stages in order ([Pipelines](../guides/recipes.md#pipelines-of-stages)).",
        "",
        "| stage | does | takes |",
        "|---|---|---|",
    ]
    for stage in pipeline.stages:
        kind = type(stage).__name__.lower()
        what = " ".join(getattr(stage, "overrides", ())) or kind
        takes = getattr(stage, "init_from", None) or getattr(stage, "source", None) or ""
        lines.append(f"| `{stage.name}` | {kind}: {_cell(what)} | {f'`{takes}`' if takes else ''} |")
    return lines


def _presets_section() -> str:
    files = _yaml_files("*")
    lines = [
        "## YAML presets {#yaml-presets}",
        "",
        "Files in `conf/<group>/<option>.yaml`, chosen as `<group>=<option>`: YAML recipes in "
        "`conf/recipe/` and presets such as `debug=fast` that apply on top of any recipe.",
    ]
    if not files:
        lines += ["", "None are installed."]
    for path in files:
        group, option = path.parent.name, path.stem
        text = path.read_text()
        about = _yaml_about(text)
        lines += ["", f"### `{group}={option}` {{#{_anchor(group, option)}}}", ""]
        if about:
            lines += [about, ""]
        lines += [f"`conf/{group}/{path.name}`:", "", "```yaml", text.rstrip(), "```"]
    return "\n".join(lines)


def _yaml_files(group: str) -> list[Path]:
    """The shipped YAML presets of *group* (``*`` for every group), sorted."""
    from blocks.core import paths

    conf = paths.conf_dir()
    return sorted(conf.glob(f"{group}/*.yaml")) if conf is not None else []


def _yaml_about(text: str) -> str:
    """The leading comment lines of a YAML preset, without the ``@package`` directive."""
    about = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        comment = line.lstrip("#").strip()
        if comment and not comment.startswith("@package"):
            about.append(comment)
    return _rst(" ".join(about))


# --- small helpers ---------------------------------------------------------------------------


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _anchor(kind: str, name: str) -> str:
    return f"{kind}-{_slug(name)}"


def _source(fn: Any) -> str:
    """``recipes/charlm.py:charlm`` relative to the recipes directory's parent, when possible."""
    try:
        path = Path(inspect.getsourcefile(fn) or "")
    except TypeError:
        return f"{fn.__module__}.{fn.__qualname__}"
    from blocks.core import paths

    recipes = paths.recipes_dir()
    if recipes is not None and path.is_relative_to(recipes):
        return f"recipes/{path.relative_to(recipes).as_posix()}:{fn.__qualname__}"
    return f"{fn.__module__}.{fn.__qualname__}"


def _value(value: Any) -> str:
    """A default as it is written in an override (``null``, ``true``, ``[64, 64]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, str):
        return value if value else "''"
    return repr(value)


def _changed(block: Any) -> str:
    """``field=value`` for the fields that differ from the block class's defaults."""
    default = type(block)()
    return " ".join(
        f"`{f.name}={_value(getattr(block, f.name))}`"
        for f in dataclasses.fields(block)
        if getattr(block, f.name) != getattr(default, f.name)
    )


def _rst(text: str) -> str:
    """Docstring markup to Markdown: ``code`` → `code`, :role:`x` → `x`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _code(text: str) -> str:
    return _cell(f"`{text}`")


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: pipes escaped, except inside code spans.

    Python-Markdown's tables never split a row inside a code span, and an escape there would
    show up literally.
    """
    parts = text.replace("\n", " ").split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))
