"""Hydra launcher settings checked against the job they launch (submitit's tasks and GPUs), and blocks' Ray launcher."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from omegaconf import DictConfig

from blocks.spec.errors import Problem

SUBMITIT = "hydra_submitit_launcher"

RAY_LAUNCHER_NODE: dict[str, Any] = {
    "_target_": "hydra_plugins.blocks_ray_launcher.ray_launcher.RayLauncher",
    "address": None,
    "job_cpus": 0.0,
}
"""``hydra/launcher=ray``: a sweep's jobs as Ray tasks (blocks' own launcher, see :mod:`blocks.launch.ray_sweep`)."""

REMOTE_LAUNCHERS = (f"{SUBMITIT}.submitit_launcher.SlurmLauncher", RAY_LAUNCHER_NODE["_target_"])
"""Hydra launchers whose jobs run on other machines (SLURM's nodes, a Ray cluster)."""

RAY_ADDRESS_ENV = "RAY_ADDRESS"
"""The Ray cluster the Ray launchers connect to; without it they start a local Ray instance."""

MACHINE_CHECKS = frozenset({"compile-cxx"})
"""Checks of the planning machine's own software: errors when the job runs here, warnings when it runs elsewhere."""


def launches_elsewhere(cfg: DictConfig) -> bool:
    """Whether a composed config (with its ``hydra`` node) sweeps with a launcher that runs its jobs on other machines.

    The Ray launcher does only when it connects to a cluster (``hydra.launcher.address`` or
    ``$RAY_ADDRESS``): without one it starts a local Ray instance, on this machine.
    """
    target = str(_get(cfg, "hydra", "launcher", "_target_") or "")
    multirun = "MULTIRUN" in str(_get(cfg, "hydra", "mode"))
    if target == RAY_LAUNCHER_NODE["_target_"]:
        return multirun and bool(_get(cfg, "hydra", "launcher", "address") or os.environ.get(RAY_ADDRESS_ENV))
    return multirun and any(target.endswith(remote) for remote in REMOTE_LAUNCHERS)


def as_elsewhere(problems: tuple[Problem, ...]) -> tuple[Problem, ...]:
    """*problems* with the :data:`MACHINE_CHECKS` errors made warnings: this machine is not the one the job runs on.

    The job plans itself again where it runs, and errors there.
    """
    note = " (a warning here: hydra.launcher runs the job on another machine, which plans it again)"
    return tuple(
        dataclasses.replace(p, severity="warning", message=p.message + note)
        if p.check in MACHINE_CHECKS and p.is_error
        else p
        for p in problems
    )


def launcher_problems(cfg: DictConfig) -> list[Problem]:
    """Problems of a composed config (with its ``hydra`` node) whose submitit launcher cannot run the job.

    The driver runs once per submitit task and starts ``trainer.devices`` processes itself, so
    a job needs exactly one task per node, and a GPU job needs ``gpus_per_node`` equal to
    ``trainer.devices``.
    """
    launcher = _get(cfg, "hydra", "launcher")
    if isinstance(launcher, DictConfig) and launcher.get("_target_") == RAY_LAUNCHER_NODE["_target_"]:
        missing = ray_missing(
            "hydra/launcher",
            "pip install 'blocks[ray]' (or drop hydra/launcher=ray to run the jobs one by one)",
        )
        return [missing] if missing else []
    if not isinstance(launcher, DictConfig) or SUBMITIT not in str(launcher.get("_target_", "")):
        return []
    devices = _get(cfg, "trainer", "devices")
    accelerator = str(_get(cfg, "trainer", "accelerator") or "auto")
    tasks = launcher.get("tasks_per_node")
    gpus = launcher.get("gpus_per_node")
    problems = []
    if tasks is not None and tasks != 1:
        problems.append(
            Problem(
                "hydra.launcher.tasks_per_node",
                f"is {tasks}, but a blocks job is one driver per node that starts the trainer.devices "
                f"processes itself; {tasks} tasks would start {tasks} copies of the job",
                "hydra.launcher.tasks_per_node=1",
                check="launcher-devices",
                related=("trainer.devices",),
            )
        )
    if gpus and isinstance(devices, int) and gpus != devices:
        problems.append(
            Problem(
                "hydra.launcher.gpus_per_node",
                f"is {gpus}, but trainer.devices={devices}: each job's processes need one GPU each",
                f"hydra.launcher.gpus_per_node={devices} (or trainer.devices={gpus})",
                check="launcher-devices",
                related=("trainer.devices",),
            )
        )
    elif not gpus and accelerator == "gpu" and "Slurm" in str(launcher.get("_target_", "")):
        problems.append(
            Problem(
                "hydra.launcher.gpus_per_node",
                f"is not set, so SLURM gives the job no GPUs, but trainer.accelerator=gpu and trainer.devices={devices}",
                f"hydra.launcher.gpus_per_node={devices}",
                check="launcher-devices",
                related=("trainer.devices", "trainer.accelerator"),
            )
        )
    return problems


def ray_missing(key: str, fix: str) -> Problem | None:
    """The problem of *key* choosing Ray when Ray cannot be imported (None when it can); *fix* says what to do."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return Problem(key, "is 'ray', but Ray is not installed", fix, check="ray-placement")
    return None


def _get(cfg: DictConfig, *keys: str) -> Any:
    """``cfg[k1][k2]...`` without resolving interpolations that fail (None then)."""
    node: Any = cfg
    for key in keys:
        try:
            node = node.get(key) if isinstance(node, DictConfig) else None
        except Exception:
            return None
    return node
