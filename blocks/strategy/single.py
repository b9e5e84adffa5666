"""``strategy=single``: one process on one device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blocks.spec.registry import register
from blocks.strategy.base import StrategyBlock

if TYPE_CHECKING:
    from blocks.precision.base import PrecisionBlock


@register("single")
@dataclass(frozen=True, kw_only=True)
class Single(StrategyBlock):
    """One process on one device (CPU or one GPU); runs in the driver's process, no launcher."""

    max_world_size = 1

    def build(self, *, accelerator: str, precision: PrecisionBlock, world_size: int, io: Any = None) -> Any:
        """Lightning's single-device strategy on the accelerator's first device."""
        from pytorch_lightning.strategies import SingleDeviceStrategy

        return SingleDeviceStrategy(device="cuda:0" if accelerator == "gpu" else "cpu", checkpoint_io=io)
