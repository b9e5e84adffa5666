"""Monitor blocks."""

from typing import TYPE_CHECKING

from blocks.spec.lazy import lazy_exports

if TYPE_CHECKING:
    from blocks.monitor.base import Monitor, MonitorBlock

__all__ = ["Monitor", "MonitorBlock"]

# Importing the package imports none of its blocks: each module loads when a name is first used.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Monitor": "blocks.monitor.base",
        "MonitorBlock": "blocks.monitor.base",
    },
)
