"""One config for every rank: the nodes of a job refuse to train when their drivers wrote different ones.

Each node's driver of a multi-node job writes ``config.yaml`` into the shared run dir; the last
write wins, and every worker reads that one. A node started with other overrides would train
with another node's config without a word. Each worker is given its driver's config
(:class:`DriverConfig`), and once the process group is up every rank compares it, and the
``config.yaml`` it read, with every other rank's: when they differ, every rank stops before
training with the same error, naming the keys that differ.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import pytorch_lightning as pl
from omegaconf import OmegaConf

from blocks.core.run_files import config_digest, differing_keys
from blocks.runtime.ranks import every_rank
from blocks.spec.errors import BlocksError, Problem

SAME_COMMAND_FIX = (
    "run the same command on every node: the same overrides and the same hydra.run.dir (only "
    "the environment, such as BLOCKS_RDZV_ENDPOINT, may differ)"
)
SHOWN_KEYS = 5


@dataclass(frozen=True)
class DriverConfig:
    """The ``config.yaml`` the driver of this rank's node wrote.

    Attributes:
        digest: its sha256 (:func:`~blocks.core.run_files.config_digest`).
        text: its text, when the driver passed it (to name the keys that differ).
    """

    digest: str
    text: str | None = None


@dataclass(frozen=True)
class _RankConfig:
    host: str
    driver: str
    used: str


class SameConfigOnEveryRank(pl.Callback):
    """At ``setup`` (the process group is up, nothing trained), refuse ranks whose configs differ (:func:`check_same_config`)."""

    def __init__(self, driver: DriverConfig, used_text: str) -> None:
        self.driver = driver
        self.used_text = used_text

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Compare the configs of every rank (a collective)."""
        check_same_config(self.driver, self.used_text)


def check_same_config(driver: DriverConfig, used_text: str) -> None:
    """Raise a :class:`BlocksError` on every rank when the ranks' drivers wrote different configs.

    Also when a rank's ``config.yaml`` (*used_text*) is not its driver's: the file was
    rewritten after the driver wrote it. A collective: every rank must call it.
    """
    mine = _RankConfig(socket.gethostname(), driver.digest, config_digest(used_text))
    ranks: list[_RankConfig] = every_rank(mine)
    if len({r.driver for r in ranks} | {r.used for r in ranks}) == 1:
        return
    texts: list[tuple[str | None, str]] = every_rank((driver.text, used_text))  # all ranks take this branch
    other = next((i for i, r in enumerate(ranks) if r.driver != ranks[0].driver), None)
    if other is not None:
        raise BlocksError(_differ(ranks, texts, other))
    rank = next(i for i, r in enumerate(ranks) if r.used != r.driver)
    keys = _keys(texts[rank][0], texts[rank][1])
    raise BlocksError(
        Problem(
            keys[0] if keys else "hydra.run.dir",
            f"the config.yaml rank {rank} (host {ranks[rank].host}) read is not the one its node's "
            f"driver wrote{_listed(keys)}: another job wrote into the run dir after this job started",
            "start one job at a time in a run dir (or choose another hydra.run.dir), and run the same "
            "command again",
            related=tuple(keys[1:]),
        )
    )


def _differ(ranks: list[_RankConfig], texts: list[tuple[str | None, str]], other: int) -> Problem:
    """The error for rank 0's and rank *other*'s drivers having written different configs."""
    first, second = _container(texts[0][0]), _container(texts[other][0])
    keys = differing_keys(first, second) if first is not None and second is not None else []
    configs = len({r.driver for r in ranks})
    if keys:
        shown = keys[:SHOWN_KEYS]
        more = f" (and {len(keys) - SHOWN_KEYS} more keys)" if len(keys) > SHOWN_KEYS else ""
        which = (
            f": rank 0 (host {ranks[0].host}) has {_values(first, shown)}; rank {other} "
            f"(host {ranks[other].host}) has {_values(second, shown)}{more}"
        )
    else:
        which = f": rank 0 (host {ranks[0].host}) and rank {other} (host {ranks[other].host}) differ"
    if configs > 2:
        which += f" ({configs} different configs in all)"
    return Problem(
        keys[0] if keys else "hydra.run.dir",
        "the nodes of this job were started with different configs, and every node would train with "
        f"whichever config.yaml was written last, so none trains{which}",
        SAME_COMMAND_FIX,
        related=tuple(keys[1:SHOWN_KEYS]),
    )


def _keys(before: str | None, after: str | None) -> list[str]:
    """The keys two config texts differ in (none when one is unknown)."""
    first, second = _container(before), _container(after)
    if first is None or second is None:
        return []
    return differing_keys(first, second)


def _container(text: str | None) -> object:
    """A config text as plain containers, interpolations (values from the environment) left as text."""
    if text is None:
        return None
    return OmegaConf.to_container(OmegaConf.create(text), resolve=False)


def _listed(keys: list[str]) -> str:
    """``: a, b, c`` for the first :data:`SHOWN_KEYS` keys (nothing for none)."""
    if not keys:
        return ""
    more = f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
    return " (it differs in " + ", ".join(keys[:SHOWN_KEYS]) + more + ")"


def _values(config: object, keys: list[str]) -> str:
    """``optim.lr=0.1, data.batch_size=16``: each key's value in *config* (``<unset>`` when it lacks it)."""
    return ", ".join(f"{key}={_value(config, key)}" for key in keys)


def _value(config: object, key: str) -> str:
    for name in key.split("."):
        if not isinstance(config, dict) or name not in config:
            return "<unset>"
        config = config[name]
    shown = str(config)
    return shown if len(shown) <= 40 else shown[:37] + "..."
