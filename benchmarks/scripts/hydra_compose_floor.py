"""The floor under ``blocks plan``: a fresh process that composes one Hydra config and prints a rich panel.

Usage: ``python hydra_compose_floor.py GROUPS``. A primary config whose defaults list picks one
structured-config option in each of GROUPS groups (``blocks plan`` composes one group per block
kind), composed once with ``return_hydra_config=True`` as ``blocks`` composes, then shown in a
rich panel. No ``blocks`` import: what any Hydra-based CLI pays before it does its own work.
"""

import sys
from dataclasses import dataclass, field
from typing import Any

from hydra import compose, initialize
from hydra.core.config_store import ConfigStore
from rich.console import Console
from rich.panel import Panel


@dataclass
class Option:
    """A small block-like structured config."""

    width: int = 64
    depth: int = 2
    name: str = "option"
    rate: float = 1e-3


def main(groups: int) -> None:
    """Store, compose and print."""
    names = [f"group{i}" for i in range(groups)]
    defaults: list[Any] = [{name: "option"} for name in names] + ["_self_"]

    @dataclass
    class Primary:
        defaults: list[Any] = field(default_factory=lambda: defaults)

    store = ConfigStore.instance()
    store.store(name="primary", node=Primary)
    for name in names:
        store.store(group=name, name="option", node=Option)
    with initialize(version_base="1.3", config_path=None):
        cfg = compose("primary", return_hydra_config=True)
    Console().print(Panel("\n".join(f"{name}: {dict(cfg[name])}" for name in names), title="floor"))


if __name__ == "__main__":
    main(int(sys.argv[1]))
