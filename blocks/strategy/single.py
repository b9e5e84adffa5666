"""``strategy=single``: one process on one device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blocks.core.registry import register
from blocks.strategy.base import StrategyBlock


@register("single")
@dataclass(frozen=True, kw_only=True)
class Single(StrategyBlock):
    """One process on one device (CPU or one GPU); runs in the driver's process, no launcher."""

    max_world_size = 1

    def build(self, *, accelerator: str, model_units: str | None) -> Any:
        """Lightning's single-device strategy."""
        return "auto"
