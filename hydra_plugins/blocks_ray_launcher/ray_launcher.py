"""``hydra/launcher=ray``: a sweep's jobs as Ray tasks.

Hydra instantiates launchers only from the ``hydra_plugins`` namespace package; the launcher
itself is :class:`blocks.launch.ray_sweep.RayLauncher`. Importing this module does not import
Ray (Hydra imports every plugin module when it scans for plugins).
"""

from __future__ import annotations

from blocks.launch import ray_sweep


class RayLauncher(ray_sweep.RayLauncher):
    """Runs each job of a sweep as a Ray task (see :class:`blocks.launch.ray_sweep.RayLauncher`)."""
