"""Hydra composition: blocks and recipes as config groups, and configs back into blocks.

Every registered block is an option of its kind's group; its node is the block's typed
dataclass fields plus ``_block_``, the registered name, so a resolved config (``config.yaml``)
says which block to rebuild without any import path in it. A recipe is an option of the
``recipe`` group that chooses an option in each group; a block the recipe customizes becomes
a preset named after the recipe (``model=charlm``), so choosing another model drops the
recipe's model settings instead of merging them into the wrong block.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf, read_write
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from blocks.compat.hydra_private import (
    config_child,
    config_root,
    hydra_config_loader,
    hydra_message,
    structured_type,
)
from blocks.core.secrets import resolve_keeping_env
from blocks.spec.block import KINDS, Block
from blocks.spec.errors import ConfigError, Problem, RegistryError, did_you_mean
from blocks.spec.kinds import CROSS_KIND_GROUPS, KIND_TABLE, BlockKind
from blocks.spec.kinds import GROUPS as ALL_GROUPS
from blocks.spec.registry import active_registry

if TYPE_CHECKING:
    from hydra.core.config_store import ConfigStore

PRIMARY_CONFIG = "blocks"
BLOCK_KEY = "_block_"
DEFAULT_RECIPE = "charlm"
GROUP_DEFAULTS: dict[str, str] = {kind.name: kind.default for kind in KIND_TABLE}
"""The option each kind takes when a recipe names none (from the kind table)."""
GROUPS = ALL_GROUPS


def field_keys(node: DictConfig) -> list[str]:
    """The keys of a block's config node: its fields, without ``_block_``."""
    return [str(key) for key in node if key != BLOCK_KEY]


def block_node(block: Block) -> DictConfig:
    """The config node of *block*: ``_block_`` plus its typed fields (struct, so typos fail)."""
    if not block.block_name:
        raise RegistryError(
            f"{type(block).__qualname__} is not a registered block; decorate it with @register"
        )
    return _typed_node(block, block.block_name)


def _typed_node(block: Block | type[Block], name: str) -> DictConfig:
    """``_block_: name`` and the fields of *block* (an instance, or a class for its defaults), typed and struct."""
    typed = OmegaConf.structured(block)
    OmegaConf.set_readonly(typed, False)
    # ``_block_`` first, so config.yaml says which block before its fields; both inputs are
    # this function's own, so the merge need not copy them.
    node = OmegaConf.unsafe_merge(OmegaConf.create({BLOCK_KEY: name}), typed)
    assert isinstance(node, DictConfig)
    OmegaConf.set_struct(node, True)
    for key in node:
        child = config_child(node, key)
        if isinstance(child, DictConfig):
            # A dict field (an adapter's kwargs) takes keys the block cannot know: model.kwargs.depth=4.
            OmegaConf.set_struct(child, False)
    return node


def store_option(store: ConfigStore, group: str, name: str, node: Any, package: str | None = None) -> None:
    """Store *node* as option *name* of *group*; a namespaced name (``acme/resnet``) nests.

    Hydra looks ``model=acme/resnet`` up as ``model/acme/resnet``, so the option is stored in
    the sub-group ``model/acme``; its package stays the group's own (``model``) unless given.
    """
    prefix, _, leaf = name.rpartition("/")
    sub = f"{group}/{prefix}" if prefix else group
    store.store(group=sub, name=leaf, node=node, package=package or (group if prefix else None))


def group_options(group: str) -> list[str]:
    """Every option of *group* that Hydra can compose: registered, stored and YAML, namespaced ones too."""
    from hydra.core.object_type import ObjectType

    from blocks.core import paths

    conf = paths.conf_dir()
    loader = hydra_config_loader([("blocks", f"file://{conf}")] if conf is not None else [])

    def walk(path: str, prefix: str) -> list[str]:
        found = [prefix + o for o in loader.get_group_options(path, results_filter=ObjectType.CONFIG)]
        for sub in loader.get_group_options(path, results_filter=ObjectType.GROUP):
            found += walk(f"{path}/{sub}", f"{prefix}{sub}/")
        return found

    return sorted(set(walk(group, "")))


def _options_with_subgroups(group: str, options: list[str]) -> list[str]:
    """Every option of *group*, a package's ``acme/wide`` too (Hydra's own list has its top level only)."""
    try:
        return sorted({*options, *group_options(group)})
    except Exception:  # the group cannot be listed here: Hydra's list is still right for built-ins
        return options


def primary_node(conf_dirs: Sequence[str], kinds: Sequence[BlockKind] = KIND_TABLE) -> dict[str, Any]:
    """The primary config: the defaults list of every group (kinds from the kind table), and Hydra's run-dir layout."""
    defaults: list[Any] = ["_self_"]
    defaults += [{kind.name: kind.default} for kind in kinds]
    defaults += [{group: DEFAULT_RECIPE if group == "recipe" else None} for group in CROSS_KIND_GROUPS]
    return {
        "defaults": defaults,
        "hydra": {
            "searchpath": [f"file://{d}" for d in conf_dirs],
            "run": {"dir": "outputs/${hydra.runtime.choices.recipe}/${now:%Y-%m-%d_%H-%M-%S}"},
            "sweep": {
                "dir": "multirun/${hydra.runtime.choices.recipe}/${now:%Y-%m-%d_%H-%M-%S}",
                "subdir": "${hydra.job.num}",
            },
            "job": {"chdir": False, "name": "blocks"},
            "callbacks": {"blocks_sweep_outcome": {"_target_": "blocks.launch.sweep.SweepOutcome"}},
        },
    }


def config_to_blocks(config: Mapping[str, Any] | DictConfig) -> dict[str, Block]:
    """Rebuild the block of every kind from a composed or saved config, validating each field."""
    cfg = config if isinstance(config, DictConfig) else OmegaConf.create(dict(config))
    cfg = _typed_and_resolved(cfg) or cfg
    problems: list[Problem] = []
    out: dict[str, Block] = {}
    for kind in KINDS:
        node = cfg.get(kind)
        if not isinstance(node, DictConfig) or BLOCK_KEY not in node:
            problems.append(
                Problem(
                    kind,
                    f"no {kind} block is chosen",
                    f"{kind}=<one of {', '.join(active_registry().names(kind))}>",
                    check="missing-value",
                )
            )
            continue
        try:
            out[kind] = node_to_block(kind, node)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return out


def _typed_and_resolved(cfg: DictConfig) -> DictConfig | None:
    """A saved config as the driver had it: resolved with each block node typed by its class.

    ``config.yaml`` is untyped and keeps the interpolations of values that read the
    environment. Resolved as it is, a value passed on from a typed field to an untyped one
    (``${trainer.seed}`` in ``monitor.logger_args``) would be the environment's string where
    the driver had the field's int. The resolved values are then checked against each block
    again (a string from the environment for a list field resolves, but does not fit). None
    for a composed config (typed already) and for one whose nodes do not fit their blocks:
    converting them node by node names the problem.
    """
    classes: dict[str, tuple[str, type[Block]]] = {}
    for kind in KINDS:
        node = cfg.get(kind)
        if not isinstance(node, DictConfig) or BLOCK_KEY not in node:
            return None
        try:
            name = str(node[BLOCK_KEY])
            classes[kind] = name, active_registry().get(kind, name).cls
        except (RegistryError, OmegaConfBaseException):
            return None
    if all(structured_type(cfg[kind]) is cls for kind, (_, cls) in classes.items()):
        return None
    typed = copy.deepcopy(cfg)
    try:
        schemas = {kind: _typed_node(cls, name) for kind, (name, cls) in classes.items()}
        with read_write(typed):
            for kind, schema in schemas.items():
                typed[kind] = OmegaConf.merge(schema, cfg[kind])
        plain = OmegaConf.to_container(typed, resolve=True)
        assert isinstance(plain, dict)
        resolved = OmegaConf.create(plain)
        for kind, schema in schemas.items():
            resolved[kind] = OmegaConf.merge(schema, plain[kind])
    except OmegaConfBaseException:
        return None
    return resolved


def node_to_block(kind: str, node: DictConfig) -> Block:
    """One block from its config node; unknown fields, missing values and bad types are errors."""
    name = str(node[BLOCK_KEY])
    try:
        cls = active_registry().get(kind, name).cls
    except RegistryError as exc:
        namespace = name.split("/", 1)[0] if "/" in name else ""
        from blocks.core.packages import refuse_unusable

        refuse_unusable([namespace] if namespace else [])  # installed, but failed to import: say why
        installed = any(n.startswith(namespace + "/") for n in active_registry().names(kind))
        if namespace and not installed:  # the package that registered it is not installed here
            fix = (
                f"install the block package of the namespace '{namespace}' (its entry point "
                f"blocks: {namespace}), e.g. pip install <its distribution>; blocks list shows the installed ones"
            )
        else:
            fix = f"{kind}=<one of {', '.join(active_registry().names(kind))}>"
        raise ConfigError(Problem(kind, exc.problems[0].message, fix, check="unknown-option")) from None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    # Keys only: reading a value would resolve it, and a ``???`` value raises on read.
    keys = field_keys(node)
    problems = []
    for key in keys:
        if key not in fields:
            hint = did_you_mean(str(key), fields)
            problems.append(
                Problem(
                    f"{kind}.{key}",
                    f"{kind}={name} has no field '{key}'" + (f"; {hint}" if hint else ""),
                    f"fields of {kind}={name}: {', '.join(fields)}",
                    check="unknown-key",
                )
            )
    for key in fields:
        if key in keys and OmegaConf.is_missing(node, key):
            problems.append(
                Problem(
                    f"{kind}.{key}",
                    "is required and has no value",
                    f"{kind}.{key}=<value>",
                    check="missing-value",
                )
            )
    if problems:
        raise ConfigError(problems)
    try:
        typed: DictConfig | ListConfig = node
        if structured_type(node) is not cls or len(keys) != len(fields):
            # A saved or hand-written config; a composed node typed by its own block class had
            # every value validated when it was set.
            base = OmegaConf.structured(cls)
            OmegaConf.set_readonly(base, False)
            # resolved where the node sits, so a value may interpolate any key of the config
            values = OmegaConf.to_container(node, resolve=True)
            assert isinstance(values, dict)
            typed = OmegaConf.merge(base, OmegaConf.create({k: values[k] for k in keys}))
        container = OmegaConf.to_container(typed, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_problem(exc, prefix=kind)) from None
    assert isinstance(container, dict)
    hints = typing.get_type_hints(cls)
    kwargs = {str(k): _coerce(hints.get(str(k)), v) for k, v in container.items() if k != BLOCK_KEY}
    return cls(**kwargs)


def _coerce(annotation: Any, value: Any) -> Any:
    """Lists from OmegaConf become tuples where the field is a tuple (blocks stay hashable)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if typing.get_origin(arg) is tuple:
                origin = tuple
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    return value


def _omegaconf_problem(exc: OmegaConfBaseException, prefix: str = "") -> Problem:
    key = str(getattr(exc, "full_key", "") or "")
    if prefix and key and not key.startswith(prefix + "."):
        key = f"{prefix}.{key}"
    message = str(getattr(exc, "msg", "") or exc).splitlines()[0]
    return Problem(
        key or prefix, message, _omegaconf_fix(key or prefix, message), check=_omegaconf_check(message)
    )


def _omegaconf_fix(key: str, message: str) -> str:
    """How to fix one of OmegaConf's errors about *key*, from its message."""
    expected = hydra_message("converted", message)
    kind = key.split(".", 1)[0]
    if expected:
        return f"give {key} a value of type {expected.group(1).lower()}"
    if "is not Optional" in message:
        return f"{key} cannot be null: give it a value (see `blocks list {kind}`)"
    if "is not a ListConfig, list or tuple" in message:
        return f"give {key} a list, e.g. {key}=[64,64]"
    if "not support deletion" in message:
        return f"block fields cannot be deleted; set a value instead ({key}=...)"
    if "nterpolation" in message or "resolving" in message:
        return interpolation_fix(key, message)
    return f"give {key} a value of its field's type (see `blocks list {kind}`)" if key else ""


_ENV_VARIABLE = re.compile(r"oc\.env:\s*([^,}\s]+)|Environment variable '([^']+)'")


def interpolation_fix(key: str, text: str) -> str:
    """How to fix an interpolation at *key* that does not resolve; *text* is its value and/or the error."""
    env = _ENV_VARIABLE.search(text)
    if env is not None:
        name = env.group(1) or env.group(2)
        return f"set the environment variable {name}, or give a default: {key}='${{oc.env:{name},<default>}}'"
    if "HydraConfig was not set" in text or "${hydra:" in text:
        return (
            f"write {key}'s value itself: ${{hydra:...}} is resolved in Hydra's own settings (hydra.*) only "
            "(a run's files, checkpoints included, go into its run dir by default)"
        )
    example = "${trainer.max_steps}" if key != "trainer.max_steps" else "${trainer.max_epochs}"
    return f"interpolate a key that exists (e.g. {key}='{example}') or set a plain value"


def _omegaconf_check(message: str) -> str:
    """A stable check name for one of OmegaConf's errors."""
    if "nterpolation" in message or "resolving" in message:
        return "interpolation"
    if "missing" in message.lower():
        return "missing-value"
    return "type"


def _yaml_problem(exc: yaml.YAMLError) -> Problem:
    """A config file that is not YAML: the problem names its group (from the file's folder), the file and the place."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = (
        f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}"
        if mark is not None
        else "a config file"
    )
    folder = Path(mark.name).parent.name if mark is not None else ""
    what = " ".join(
        str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part
    )
    return Problem(
        folder if folder in ALL_GROUPS else "",
        f"{where} is not valid YAML: {what or exc}",
        "correct the file; quote a value that holds ': ', '{', '[' or '${...}' "
        "(e.g. key: '${other}'), or write a mapping on lines of its own",
        check="yaml-syntax",
    )


def translate_compose_error(
    exc: BaseException, overrides: Sequence[str], known_keys: Mapping[str, Sequence[str]]
) -> ConfigError:
    """A Hydra composition exception as a :class:`ConfigError` naming the key and the fix.

    *known_keys* maps each group to the keys of the option that would be chosen without the
    failing override (for did-you-mean).
    """
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    if isinstance(exc, MissingConfigException):
        missing = str(getattr(exc, "missing_cfg_file", "") or "")
        options = list(getattr(exc, "options", None) or [])
        if "/" in missing:
            group, option = missing.split("/", 1)
            options = _options_with_subgroups(group, options)
            hint = did_you_mean(option, options)
            return ConfigError(
                Problem(
                    group,
                    f"no option '{option}' in group '{group}'" + (f"; {hint}" if hint else ""),
                    f"available: {', '.join(options)}" if options else "",
                    check="unknown-option",
                )
            )
        match = hydra_message("missing_group", str(exc))
        if match:
            group = match.group(1)
            return ConfigError(
                Problem(
                    group,
                    f"no {group} option is chosen",
                    f"{group}=<one of {', '.join(options)}>",
                    check="missing-value",
                )
            )
        return ConfigError(Problem("", str(exc).splitlines()[0]))
    if isinstance(exc, OverrideParseException):
        lines = str(exc).splitlines()
        match = hydra_message("override", lines[0])
        detail = lines[1] if len(lines) > 1 else ""
        return ConfigError(
            Problem(
                match.group(1) if match else "",
                f"{lines[0]}: {detail}",
                "write overrides as key=value, e.g. optim.lr=3e-4 (quote values with special characters)",
                check="override-syntax",
            )
        )
    cause = exc.__cause__ if isinstance(exc, ConfigCompositionException) else exc
    if isinstance(cause, yaml.YAMLError):
        return ConfigError(_yaml_problem(cause))
    override = _failing_override(str(exc), overrides)
    if isinstance(cause, OmegaConfBaseException):
        problem = _omegaconf_problem(cause)
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            key = problem.key or override
            if key in CROSS_KIND_GROUPS and _key_of(override).startswith(f"{key}."):
                return ConfigError(_preset_group_key_problem(_key_of(override)))
            own = _keys_of_the_failing_block(cause)
            first = _unknown_key_problem(key, own if key.partition(".")[0] in own else known_keys)
            return ConfigError([first, *_unknown_block_keys_of_other_overrides(cause, overrides, key)])
        if override and "=" in override:
            value = override.split("=", 1)[1]
            problem = dataclasses.replace(problem, message=f"'{value}' is not valid here: {problem.message}")
        return ConfigError(problem)
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if message.startswith("Config group override must be"):
        group = next(
            (_key_of(o) for o in overrides if _key_of(o) in GROUPS and o.split("=", 1)[-1] in ("null", "")),
            "",
        )
        return ConfigError(
            Problem(
                group,
                f"a {group or 'config group'} option must be a name: {message}",
                f"{group}=<one of its options>; see `blocks list {group}`" if group else "",
                check="unknown-option",
            )
        )
    if hydra_message("sweep_without_multirun", message):
        return ConfigError(_sweep_without_multirun_problem(message, override))
    inside = hydra_message("raised_while_composing", message, anchored=True)
    key_match = hydra_message("full_key", str(exc))
    if inside and key_match:
        source, key = inside.group(1), key_match.group(1)
        detail = str(exc).splitlines()[1] if len(str(exc).splitlines()) > 1 else ""
        return ConfigError(
            Problem(
                key,
                f"config '{source}' sets {key}, which the chosen {key.split('.')[0]} block does not accept ({detail})",
                f"choose {_article(key.split('.')[0])} block that has this field, or give the new block its own preset "
                f"(Python recipes do this for you)",
                check="unknown-key",
            )
        )
    appended = next((o for o in overrides if o.startswith("+") and _key_of(o) == _key_of(override)), "")
    if message.startswith("Could not append to config") and appended:
        return ConfigError(appended_key_problem(appended))
    match = hydra_message("preset_could_not_override", message, anchored=True)
    if match and match.group(2) in GROUPS:
        return ConfigError(_late_group_problem(match.group(1), match.group(2)))
    match = hydra_message("could_not_override", message)
    if match:
        return ConfigError(_unknown_key_problem(match.group(1), known_keys))
    key = _key_of(override) if override else ""
    if override.startswith("~") and key.split(".", 1)[0] in KINDS and "." in key:
        group, field = key.split(".", 1)
        if field in (known_keys.get(group) or ()):  # a field whose value is null
            return ConfigError(
                Problem(
                    key,
                    f"'{override}' deletes a field of the {group} block",
                    _omegaconf_fix(key, "not support deletion"),
                    check="type",
                )
            )
        # ~key deletes a key; this one the chosen block does not have
        return ConfigError(_unknown_key_problem(key, known_keys))
    group = key.replace("/", ".").split(".", 1)[0]
    fix = (
        f"see `blocks list {group}` for the chosen block's keys" if group in KINDS else "check this override"
    )
    return ConfigError(Problem(key, message, fix if key else ""))


def _late_group_problem(preset: str, group: str) -> Problem:
    """A preset's ``override /<group>`` of a group the primary config lists after the preset's own group.

    Hydra reads the primary defaults from the end: that group is chosen before the preset is read.
    """
    own = preset.split("/", 1)[0]
    return Problem(
        group,
        f"the preset '{preset}' chooses {group} (override /{group}), but the primary config lists "
        f"{group} after {own}, so {group} is chosen before that preset is read "
        f"(a preset can choose only the groups before its own: {', '.join(_groups_before(own))})",
        f"choose it on the command line next to the preset: {own}={preset.split('/', 1)[-1]} {group}=<option>",
    )


def _groups_before(group: str) -> list[str]:
    """The groups a preset of *group* can choose: those the primary config lists before it."""
    order = [*(kind.name for kind in KIND_TABLE), *CROSS_KIND_GROUPS]
    return order[: order.index(group)] if group in order else order


def appended_key_problem(override: str) -> Problem:
    """``+trainer.max_steps=5``: ``+`` adds a new key, and this one is there already (set it instead)."""
    key, _, value = override.lstrip("+").partition("=")
    return Problem(
        key,
        f"'{override}' adds {key}, which is already there ('+' adds a new key; a block's fields always exist)",
        f"{key}={value}",
        check="override-syntax",
    )


def appended_block_fields(overrides: Sequence[str], config: DictConfig) -> list[Problem]:
    """A problem for each ``+kind.field=VALUE`` whose field the chosen block has.

    Hydra refuses to add a plain value at a key that holds one, yet adds it where the field is
    null: ``+trainer.max_steps=5`` would pass or fail by the recipe's default. A mapping or a
    list is merged into the field, as Hydra does.
    """
    problems = []
    for override in overrides:
        value = override.partition("=")[2].strip()
        if not override.startswith("+") or override.startswith("++") or value.startswith(("{", "[")):
            continue  # Hydra merges a mapping or list into the field, as '+' says
        kind, _, field = _key_of(override).partition(".")
        node = config.get(kind) if kind in KINDS else None
        if isinstance(node, DictConfig) and field in _block_fields(kind, node):
            problems.append(appended_key_problem(override))
    return problems


def _block_fields(kind: str, node: DictConfig) -> set[str]:
    """The fields of the block *node* chooses (none when it chooses no registered block)."""
    try:
        cls = active_registry().get(kind, str(node[BLOCK_KEY])).cls
    except (RegistryError, OmegaConfBaseException):
        return set()
    return {f.name for f in dataclasses.fields(cls)}


def _sweep_without_multirun_problem(message: str, override: str) -> Problem:
    fix = "add -m (--multirun) to sweep over these values"
    if message.startswith("Ambiguous value"):
        fix += "; for one list value write key=[a,b]"
    return Problem(
        override.split("=", 1)[0].lstrip("+~") if override else "", message, fix, check="sweep-without-m"
    )


def _key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _failing_override(message: str, overrides: Sequence[str]) -> str:
    for override in overrides:
        if override in message or f"'{override.split('=', 1)[0].lstrip('+~')}'" in message:
            return override
    return ""


def _preset_group_key_problem(key: str) -> Problem:
    """``debug.foo=1``: a group of presets (recipe, debug, ...) has no node, so no keys, of its own."""
    group = key.split(".", 1)[0]
    return Problem(
        key,
        f"'{group}' chooses a preset, which sets keys of the blocks; it has no keys of its own",
        f"choose a preset with {group}=<option> (`blocks list {group}`), and set a block's key "
        "directly, e.g. trainer.max_steps=5",
        check="unknown-key",
    )


_SETS_A_BLOCK_KEY = re.compile(r"([A-Za-z_]\w*)\.([A-Za-z_]\w*)=([^,()]*)$")
"""``kind.key=value`` with one plain value: an override that sets one field of a block."""


def _unknown_block_keys_of_other_overrides(
    error: OmegaConfBaseException, overrides: Sequence[str], failing_key: str
) -> list[Problem]:
    """The problems of the other overrides that set a field no chosen block has, found in *error*'s config.

    The node that lacked *failing_key* belongs to the config being composed, with every group
    choice applied: a ``kind.key=value`` whose block lacks ``key`` fails the same way in each
    later composing round (which drops only the overrides already reported), so reporting
    them now saves one composition per unknown key and says the same.
    """
    parent = error.parent_node
    if not isinstance(parent, DictConfig):
        return []
    root = config_root(parent)
    problems = []
    for override in overrides:
        match = _SETS_A_BLOCK_KEY.match(override)
        if match is None or f"{match[1]}.{match[2]}" == failing_key or match[1] not in KINDS:
            continue
        kind, field = match[1], match[2]
        node = config_child(root, kind) if isinstance(root, DictConfig) else None
        if not (isinstance(node, DictConfig) and _is_block_type(structured_type(node))):
            continue
        keys = field_keys(node)
        if field not in keys:
            problems.append(_unknown_key_problem(f"{kind}.{field}", {kind: keys}))
    return problems


def _is_block_type(owner: Any) -> bool:
    return isinstance(owner, type) and issubclass(owner, Block)


def _keys_of_the_failing_block(error: OmegaConfBaseException) -> dict[str, list[str]]:
    """``{kind: keys}`` of the block node an unknown key was set on, read from the error itself.

    OmegaConf's error carries the node the key is missing from and its dataclass: when that is
    a block (``model.widht`` on a transformer), its keys need no second composition. Empty
    for any other node (a nested field, the root config), which the composing lookup answers.
    """
    parent, owner = error.parent_node, error.object_type
    group, dot, field = str(error.full_key or "").partition(".")
    if not (dot and field and "." not in field and "[" not in field and group in KINDS):
        return {}
    if not (isinstance(parent, DictConfig) and _is_block_type(owner)):
        return {}
    return {group: field_keys(parent)}


def _unknown_key_problem(key: str, known_keys: Mapping[str, Sequence[str]]) -> Problem:
    group, _, field = key.partition(".")
    if not field and group in GROUPS:
        return Problem(
            group,
            f"config group '{group}' has no options on the config search path",
            f"keep blocks' own presets on the search path: hydra.searchpath=[<your dirs>] adds to them "
            f"(see `blocks list {group}`)"
            if group in KINDS
            else "check hydra.searchpath and the conf dirs it names",
            check="unknown-group",
        )
    if not field:
        hint = did_you_mean(group, GROUPS)
        return Problem(
            group,
            f"'{group}' is not a config group" + (f"; {hint}" if hint else ""),
            f"config groups: {', '.join(GROUPS)}",
            check="unknown-group",
        )
    known = known_keys.get(group)
    keys = list(known or ())
    hint = did_you_mean(field, keys)
    having = _blocks_with_field(group, field.split(".", 1)[0].split("[", 1)[0])
    if hint:
        fix = f"{group}.{hint.split(chr(39))[1]}=..."
    elif having:
        fix = (
            f"choose {_article(group)} block that has '{field}': {', '.join(f'{group}={n}' for n in having)}"
        )
    elif keys:
        fix = f"keys of {group}: {', '.join(keys)}"
    elif known is not None:
        fix = f"the chosen {group} block has no fields; see `blocks list {group}`"
    else:
        fix = f"use a key of the chosen {group} block; `blocks list {group}` shows each block's keys"
    return Problem(
        key, f"unknown key '{field}' in {group}" + (f"; {hint}" if hint else ""), fix, check="unknown-key"
    )


def _article(word: str) -> str:
    """``an optim``, ``a model``."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _blocks_with_field(kind: str, field: str) -> list[str]:
    """Registered blocks of *kind* that have a field called *field*."""
    if kind not in KINDS:
        return []
    return [
        e.name
        for e in active_registry().entries(kind)
        if field in {f.name for f in dataclasses.fields(e.cls)}
    ]


@dataclass(frozen=True)
class Composed:
    """A composed job config and the option chosen in each group.

    Attributes:
        config: the job's config (every kind's node), without Hydra's own settings.
        choices: the option chosen for each group, ``recipe`` included.
    """

    config: DictConfig
    choices: dict[str, str]


def split_hydra(cfg: DictConfig) -> Composed:
    """Separate a config composed with ``return_hydra_config`` (or inside a Hydra job) into a :class:`Composed`."""
    choices = {
        str(k): str(v)
        for k, v in cfg.hydra.runtime.choices.items()
        if not str(k).startswith("hydra/") and v is not None
    }
    job = OmegaConf.create({k: v for k, v in cfg.items() if k != "hydra"})  # a copy of each node
    try:
        job = resolve_keeping_env(job, in_place=True)  # environment values (secrets) stay interpolations
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_problem(exc)) from None
    return Composed(config=job, choices=choices)
