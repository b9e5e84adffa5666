"""The cluster environment Lightning's trainer gets: who started this process, and where its peers are.

Lightning detects one from the environment on its own, and so trusts variables that a process
merely inherited: a plain ``blocks run`` inside an sbatch script or an ``salloc`` shell sees
SLURM's, and a worker that ``mpirun`` started without ``mpi4py`` sees none and starts a whole
job of its own. Blocks chooses instead, from the plan's layout, and refuses what cannot work
with the keys and launcher flags to change.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from blocks.spec.errors import BlocksError, Problem

if TYPE_CHECKING:
    from blocks.core.plan import Derived, Plan

MPI_WORLD_SIZE_ENV = "OMPI_COMM_WORLD_SIZE"
"""Set by Open MPI's ``mpirun`` in every process it starts."""

MPI_EXTRA = "pip install 'blocks[mpi]'"
"""What installs ``mpi4py`` (the ``mpi`` extra)."""


def cluster_environment(plan: Plan) -> Any:
    """The ``ClusterEnvironment`` plugin for this process of *plan*'s job.

    torchrun's (or Ray's driver's, which sets torchrun's variables) when it started the
    process. Otherwise one process needs no cluster (``LightningEnvironment``), whatever
    scheduler variables it inherited. Several: SLURM's (``srun``), after checking that its
    tasks per node and nodes are ``trainer.devices`` and ``trainer.nodes``; LSF's (``jsrun``);
    MPI's (``mpirun``). Raises :class:`BlocksError` when no launcher started the process as one
    of several, before anything is written.
    """
    from lightning_fabric.plugins.environments import (
        LightningEnvironment,
        LSFEnvironment,
        MPIEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    derived = plan.derived
    if TorchElasticEnvironment.detect():
        return TorchElasticEnvironment()
    if derived.world_size == 1:
        return LightningEnvironment()
    if SLURMEnvironment.detect():
        check_slurm_layout(derived, os.environ)
        return SLURMEnvironment()
    if LSFEnvironment.detect():
        return LSFEnvironment()
    if MPIEnvironment.detect():
        return MPIEnvironment()
    raise BlocksError(no_launcher(derived, os.environ))


def check_slurm_layout(derived: Derived, environ: Mapping[str, str]) -> None:
    """Refuse srun tasks laid out other than ``trainer.nodes`` × ``trainer.devices``, naming the srun flag."""
    problems = []
    tasks, per_node, nodes = (
        _integer(environ.get(name)) for name in ("SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES")
    )
    if per_node is None and tasks is not None and tasks > 1:
        problems.append(
            Problem(
                "trainer.devices",
                f"srun started {tasks} tasks (--ntasks={tasks}) without saying how many run on each node",
                f"start them with srun --ntasks-per-node={derived.devices} --nodes={derived.nodes} "
                "(trainer.devices and trainer.nodes), not --ntasks",
                related=("trainer.nodes",),
            )
        )
    if per_node is not None and per_node != derived.devices:
        problems.append(
            Problem(
                "trainer.devices",
                f"trainer.devices={derived.devices} processes per node, but srun starts {per_node} task(s) "
                f"per node (--ntasks-per-node={per_node})",
                f"srun --ntasks-per-node={derived.devices}, or prepare the run dir with "
                f"trainer.devices={per_node}",
            )
        )
    if nodes is not None and nodes != derived.nodes:
        problems.append(
            Problem(
                "trainer.nodes",
                f"trainer.nodes={derived.nodes}, but the SLURM job has {nodes} node(s) (--nodes={nodes})",
                f"srun --nodes={derived.nodes}, or prepare the run dir with trainer.nodes={nodes}",
            )
        )
    if problems:
        raise BlocksError(problems)


def no_launcher(derived: Derived, environ: Mapping[str, str]) -> Problem:
    """Why a worker of a job of several processes cannot run here: no launcher started it as one of them."""
    world = derived.world_size
    mpi_size = environ.get(MPI_WORLD_SIZE_ENV)
    if mpi_size is not None and importlib.util.find_spec("mpi4py") is None:
        return Problem(
            "trainer.devices",
            f"mpirun started this worker as one of {mpi_size} processes ({MPI_WORLD_SIZE_ENV}={mpi_size}), "
            "but mpi4py is not installed, and without it the worker cannot learn its rank: each would "
            f"train the whole {world}-process job on its own",
            f"{MPI_EXTRA} (mpi4py, built against the system's Open MPI) on every machine",
            related=("trainer.nodes",),
        )
    slurm_note = ""
    if "SLURM_NTASKS" in environ and environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        slurm_note = (
            f"; the SLURM job is named '{environ['SLURM_JOB_NAME']}', which is taken for an interactive "
            "shell, not srun's tasks: give the job another name (--job-name)"
        )
    return Problem(
        "trainer.devices",
        f"this job has {world} processes (trainer.nodes={derived.nodes} × trainer.devices="
        f"{derived.devices}), but no launcher started this worker as one of them (no torchrun, srun, "
        f"jsrun or mpirun environment){slurm_note}",
        f"run the job with `blocks run`, which starts torchrun, or start {derived.devices} worker(s) per "
        f"node with srun --ntasks-per-node={derived.devices} or mpirun -np {world}",
        related=("trainer.nodes",),
    )


def _integer(value: str | None) -> int | None:
    """A SLURM count; None when unset or not a plain number (Lightning then judges it)."""
    return int(value) if value is not None and value.strip().isdigit() else None
