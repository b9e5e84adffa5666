"""Monitor blocks."""

from blocks.monitor.base import Monitor, MonitorBlock

__all__ = ["Monitor", "MonitorBlock"]
