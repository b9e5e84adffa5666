"""Hydra and OmegaConf internals behind one seam (torch-free); see :mod:`blocks.compat`."""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from hydra.core.override_parser.types import Override
    from omegaconf import Container, DictConfig, Node


def hydra_args_parser() -> argparse.ArgumentParser:
    """The argument parser of a ``@hydra.main`` app (``hydra._internal.utils.get_args_parser``)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def run_hydra_app(argv: Sequence[str], task_function: Callable[[DictConfig], Any], config_name: str) -> None:
    """What ``@hydra.main(version_base="1.3", config_path=None, config_name=...)`` does, for *argv* instead of ``sys.argv``.

    ``hydra.main`` reads the process's ``sys.argv``; the CLI runs it for its own argument
    list (``blocks run ARGS``, or :func:`blocks.cli.main.run_captured`) without rewriting it.
    ``--experimental-rerun`` is not supported (``blocks run`` refuses it before this).
    """
    from hydra import version
    from hydra._internal.utils import _run_hydra, get_args_parser

    version.setbase("1.3")
    parser = get_args_parser()
    args = parser.parse_args(list(argv))
    _run_hydra(
        args=args, args_parser=parser, task_function=task_function, config_path=None, config_name=config_name
    )


def run_output_dir(cfg: DictConfig) -> str:
    """The absolute run dir Hydra's job runner will use for a single run of *cfg* (``hydra.run.dir``).

    Resolved as ``hydra.core.utils.run_job`` resolves it, with the config set as the current
    Hydra config (so ``${hydra:...}`` works); a ``${now:...}`` in it is cached in *cfg*, so
    the job runner, handed the same *cfg*, names the same second.
    """
    import os

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    HydraConfig.instance().set_config(cfg)
    return os.path.abspath(str(OmegaConf.select(cfg, "hydra.run.dir")))


def run_composed(cfg: DictConfig, task_function: Callable[[DictConfig], Any]) -> None:
    """What ``@hydra.main`` does for a single run (``Hydra.run`` inside ``_run_hydra``), for a config composed already.

    *cfg* was composed with ``return_hydra_config`` (``hydra.compose``); Hydra would compose
    it again (twice: ``Hydra.get_mode``, then ``Hydra.run``). From here it is Hydra's own code:
    its logging, callbacks and ``run_job`` (the run dir, ``.hydra/`` with config.yaml,
    hydra.yaml and overrides.yaml, ``hydra.job.chdir``), errors reported as Hydra reports them.
    """
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.utils import run_and_report
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict, read_write

    def run() -> None:
        configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            if cfg.hydra.mode is None:
                cfg.hydra.mode = RunMode.RUN
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=cfg.hydra.job.config_name)
        ret = run_job(
            hydra_context=HydraContext(config_loader=hydra_config_loader(), callbacks=callbacks),
            task_function=task_function,
            config=cfg,
            job_dir_key="hydra.run.dir",
            job_subdir_key=None,
            configure_logging=True,
        )
        callbacks.on_run_end(config=cfg, config_name=cfg.hydra.job.config_name, job_return=ret)
        _ = ret.return_value  # raises the task's exception, as Hydra.run does

    try:
        run_and_report(run)
    finally:
        GlobalHydra.instance().clear()


def hydra_config_loader(extra_search_path: Sequence[tuple[str, str]] = ()) -> Any:
    """Hydra's config loader over its default search path plus *extra_search_path* ``(provider, url)`` entries.

    Hydra builds one inside ``compose``/``main`` only; listing a group's options or parsing
    sweep overrides outside a run needs its own (``hydra._internal.config_loader_impl``).
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    search_path = create_config_search_path(None)
    for provider, url in extra_search_path:
        search_path.append(provider, url)
    return ConfigLoaderImpl(config_search_path=search_path)


def split_sweep(overrides: list[Override]) -> list[list[list[str]]]:
    """The jobs Hydra's basic sweeper launches for parsed *overrides*, in one batch (``BasicSweeper.split_arguments``)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper.split_arguments(overrides, None)


def config_header(text: str) -> dict[str, str | None]:
    """The ``# @package`` header of a YAML config's text, as Hydra reads it (``ConfigSource._get_header_dict``)."""
    from hydra.plugins.config_source import ConfigSource

    return ConfigSource._get_header_dict(text)


def config_child(node: Container, key: Any) -> Node | None:
    """The child node of *node* at *key* without resolving interpolations (OmegaConf's ``_get_node``)."""
    child = node._get_node(key)
    return child if not isinstance(child, list) else None


def config_root(node: Node) -> Container:
    """The root of the config *node* belongs to (OmegaConf's ``_get_root``)."""
    return node._get_root()


def structured_type(node: Container) -> Any:
    """The dataclass a structured config node was made from, or None (OmegaConf's ``_metadata.object_type``)."""
    return node._metadata.object_type


def unresolved(node: Node) -> tuple[bool, bool, Any]:
    """``(unset, interpolation, raw value)`` of *node*, without resolving it (None and ``???`` are unset)."""
    return node._is_none() or node._is_missing(), node._is_interpolation(), node._value()


HYDRA_MESSAGES: dict[str, re.Pattern[str]] = {
    "converted": re.compile(r"converted to (\w+)"),
    "missing_group": re.compile(r"You must specify '([\w/]+)'"),
    "override": re.compile(r"override '([^=']*)"),
    "raised_while_composing": re.compile(r"In '([\w./-]+)': \w+ raised while composing config"),
    "full_key": re.compile(r"full_key: ([\w./]+)"),
    "could_not_override": re.compile(r"Could not override '([\w./]+)'"),
    "preset_could_not_override": re.compile(r"In '([\w./-]+)': Could not override '([\w./]+)'"),
    "sweep_without_multirun": re.compile(
        r"Ambiguous value for argument|Sweep parameters .* requires --multirun"
    ),
}
"""Hydra and OmegaConf report mistakes only as English text; these read the key or value out of it."""


def hydra_message(name: str, message: str, *, anchored: bool = False) -> re.Match[str] | None:
    """The match of :data:`HYDRA_MESSAGES` pattern *name* in an error *message* (at its start when *anchored*)."""
    pattern = HYDRA_MESSAGES[name]
    return pattern.match(message) if anchored else pattern.search(message)


def hydra_completion(config_loader: Any, config_name: str, line: str) -> list[str]:
    """Hydra's own completion candidates for the last word of *line* (``BashCompletion._query``)."""
    from hydra._internal.core_plugins.bash_completion import BashCompletion

    found: list[str] = BashCompletion(config_loader)._query(config_name=config_name, line=line)
    return found


def lazy_config_node(
    name: str,
    group: str | None,
    package: str | None,
    provider: str,
    build: Callable[[], Any],
    holder: dict[str, Any] | None = None,
) -> Any:
    """A ``hydra.core.config_store.ConfigNode`` whose node *build* makes the first time Hydra loads it.

    ``ConfigStore.store`` converts every node up front; a lazy one lets the store list every
    option by name while only the options a composition chooses are built (and their
    classes imported). ``ConfigStore.load`` shallow-copies the stored object and reads
    ``node``, so the built node is cached in *holder*, which the copies share; pass the same
    holder to the nodes of later stores to build the node once for all of them (safe because
    ``ConfigStore.load`` deep-copies the node it hands to a composition).
    """
    from hydra.core.config_store import ConfigNode
    from omegaconf import OmegaConf

    built: dict[str, Any] = {} if holder is None else holder

    class LazyConfigNode(ConfigNode):
        def __init__(self) -> None:
            self.name = f"{name}.yaml"
            self.group = group
            self.package = package
            self.provider = provider
            self._own: Any = None

        @property
        def node(self) -> Any:
            if self._own is not None:
                return self._own
            if "node" not in built:
                built["node"] = OmegaConf.structured(build())
            return built["node"]

        @node.setter
        def node(self, value: Any) -> None:
            self._own = value

        def __copy__(self) -> LazyConfigNode:
            # ConfigStore.load shallow-copies before reading ``node``: the copy stays lazy, so a
            # builder's error reaches the composition instead of __reduce__'s placeholder.
            clone = LazyConfigNode()
            clone._own = self._own
            return clone

        def __deepcopy__(self, memo: dict[int, Any]) -> LazyConfigNode:
            # Hydra deep-copies the store on every compose: copies share the builder, nothing is built.
            clone = LazyConfigNode()
            clone._own = copy.deepcopy(self._own, memo)
            return clone

        def __reduce__(self) -> tuple[Any, ...]:
            # Hydra's joblib/submitit launchers pickle the ConfigStore with each job: send the built
            # node as a plain ConfigNode. An option that cannot be built (a pipeline recipe) was
            # never composable; the job's overrides were checked before the sweep started.
            try:
                node = self.node
            except Exception as exc:  # the builder's own error, kept as the node's text
                node = OmegaConf.create({"_unavailable_": str(exc)})
            return (ConfigNode, (self.name, node, self.group, self.package, self.provider))

    return LazyConfigNode()


def config_store_repo() -> dict[str, Any]:
    """The nested dict of Hydra's global ``ConfigStore`` (group → … → ``name.yaml`` → ConfigNode)."""
    from hydra.core.config_store import ConfigStore

    return ConfigStore.instance().repo


def swap_config_store_repo(repo: dict[str, Any]) -> dict[str, Any]:
    """Make *repo* the content of Hydra's global ``ConfigStore``; returns the one it replaces."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    previous, store.repo = store.repo, repo
    return previous


def initialize_hydra(job_name: str) -> None:
    """What ``hydra.initialize(version_base="1.3", config_path=None, job_name=...)`` does, without its stack walk.

    ``initialize`` finds its caller with ``inspect.stack()``, reading the source of every frame
    (tens of milliseconds in a fresh process) only to compute a search path that
    ``config_path=None`` leaves empty. The caller restores Hydra's global state afterwards
    (``hydra.initialize.get_gh_backup``/``restore_gh_from_backup``).
    """
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path

    version.setbase("1.3")
    Hydra.create_main_hydra2(task_name=job_name, config_search_path=create_config_search_path(None))


def resolver_calls(value: str, resolver: str) -> list[str] | None:
    r"""The calls of *resolver* in the text of a config value, each as written; None if it does not parse.

    Walks OmegaConf's own parse tree (its generated ANTLR grammar, an internal module), so
    spacing (``${ oc.env :X}``), nesting (``${oc.decode:${oc.env:X}}``) and escapes (``\${...}``)
    count exactly as they do when OmegaConf resolves the value.
    """
    from omegaconf import grammar_parser
    from omegaconf.errors import GrammarParseError
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser

    try:
        tree = grammar_parser.parse(value)
    except GrammarParseError:
        return None
    calls, pending = [], [tree]
    while pending:
        node = pending.pop()
        if (
            isinstance(node, OmegaConfGrammarParser.InterpolationResolverContext)
            and node.resolverName().getText() == resolver
        ):
            calls.append(node.getText())
        pending.extend(node.getChildren() if hasattr(node, "getChildren") else ())
    return calls


def is_whole_interpolation(value: str) -> bool:
    """Whether *value* is one interpolation and nothing else (``${x}``, ``${oc.select:x}``), from OmegaConf's parse tree.

    Only such a value can resolve to a node (a mapping or a list); text around an
    interpolation makes the value a string.
    """
    if not (value.startswith("${") and value.endswith("}")):
        return False  # text around it, as in most values (no parse needed)
    from omegaconf import grammar_parser
    from omegaconf.errors import GrammarParseError
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser

    try:
        parts = list(grammar_parser.parse(value).text().getChildren())
    except GrammarParseError:
        return False
    return len(parts) == 1 and isinstance(parts[0], OmegaConfGrammarParser.InterpolationContext)


@contextlib.contextmanager
def hydra_config_set(cfg: DictConfig) -> Iterator[None]:
    """Inside the block ``${hydra:...}`` resolves against *cfg*'s ``hydra`` node, as when Hydra runs its job.

    Hydra's current config and the node's read-only flag (``HydraConfig.set_config`` sets it)
    are what they were afterwards.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    instance = HydraConfig.instance()
    previous, readonly = instance.cfg, cfg.hydra._get_node_flag("readonly")
    instance.set_config(cfg)
    try:
        yield
    finally:
        instance.cfg = previous
        OmegaConf.set_readonly(cfg.hydra, readonly)
