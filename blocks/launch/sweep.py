"""Expanding a command line's sweep overrides into one override list per job (before launching any)."""

from __future__ import annotations

from collections.abc import Sequence

from blocks.core import catalog, paths
from blocks.core.errors import ConfigError, Problem


def expand_sweep(overrides: Sequence[str]) -> list[list[str]]:
    """Every job's overrides, as Hydra's basic sweeper would launch them (``a=1,2 b=x,y`` → 4 jobs).

    Group globs (``model=glob(*)``) expand against the registered options and the YAML presets.
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.utils import create_config_search_path
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    catalog.load()
    search_path = create_config_search_path(None)
    conf = paths.conf_dir()
    if conf is not None:
        search_path.append("blocks", f"file://{conf}")
    parser = OverridesParser.create(config_loader=ConfigLoaderImpl(config_search_path=search_path))
    try:
        parsed = parser.parse_overrides(list(overrides))
        batches = BasicSweeper.split_arguments(parsed, None)
    except HydraException as exc:
        raise ConfigError(
            Problem("", str(exc).splitlines()[0], "check the sweep syntax, e.g. optim.lr=1e-3,3e-4")
        ) from None
    return [list(job) for batch in batches for job in batch]
