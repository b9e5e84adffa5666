"""The strategy kind: how the model and its training are spread over processes and devices."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

from blocks.spec.block import Block

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext
    from blocks.precision.base import PrecisionBlock
    from blocks.trainer.base import TrainerBlock


@dataclass(frozen=True)
class MemoryLayout:
    """Where a strategy keeps the training state, for the plan's memory estimate and the checkpoint format.

    Attributes:
        shards_parameters: parameters, gradients and optimizer state are split over the
            ``shard`` dimension of the mesh (FSDP) instead of replicated (DDP, single).
        activation_checkpointing: the model's shard units recompute their activations in backward.
        cpu_offload: sharded parameters, gradients and optimizer state live in host memory.
    """

    shards_parameters: bool = False
    activation_checkpointing: bool = False
    cpu_offload: bool = False


@dataclass(frozen=True)
class MeshShape:
    """The device-mesh dimensions a strategy lays the processes out in.

    Data parallelism is ``replicate × shard`` (DDP replicates, FSDP shards, HSDP both);
    ``tensor`` and ``pipeline`` split each model replica further. The plan records the mesh
    (``plan.json``'s ``derived.mesh``); the global batch and the sampler read the number of
    data-parallel ranks and each rank's data-parallel index from it, not from the world size.

    Global ranks are laid out row-major over ``(pipeline, replicate, shard, tensor)``, as
    ``torch.distributed.device_mesh.init_device_mesh`` lays out a mesh with those dimension
    names: the ranks of one tensor-parallel group are adjacent (on one node), and every rank of
    a tensor- or pipeline-parallel group reads the same samples.

    Attributes:
        replicate: data-parallel groups that each hold a full copy of the (sharded) state.
        shard: data-parallel ranks within a group that split the state.
        tensor: ranks that split each layer (1: no tensor parallelism).
        pipeline: ranks that split the layers into stages (1: no pipeline parallelism).
    """

    replicate: int = 1
    shard: int = 1
    tensor: int = 1
    pipeline: int = 1

    @property
    def data_parallel(self) -> int:
        """Ranks that each read different samples (``replicate × shard``)."""
        return self.replicate * self.shard

    @property
    def world_size(self) -> int:
        """Processes the mesh spans."""
        return self.data_parallel * self.tensor * self.pipeline

    def data_parallel_rank(self, rank: int) -> int:
        """The data-parallel index (``0 .. data_parallel - 1``) of global *rank*: which share of each global batch it reads."""
        return (rank // self.tensor) % self.data_parallel


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""The modes of ``torch.compile``."""


def inductor_cxx() -> str:
    """The C++ compiler inductor builds CPU kernels with: ``$CXX``, else ``g++`` (``clang++`` on macOS)."""
    return os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")


def has_inductor_cxx() -> bool:
    """Whether this machine has :func:`inductor_cxx` on ``PATH`` (or inductor may fetch g++ with conda itself)."""
    return bool(shutil.which(inductor_cxx()) or os.environ.get("TORCH_INDUCTOR_INSTALL_GXX"))


@dataclass(frozen=True, kw_only=True)
class StrategyBlock(Block):
    """Base of strategy blocks.

    ``shards_parameters`` says whether parameters, gradients and optimizer state are split
    across processes (FSDP) or replicated (DDP, single); the plan's memory estimate and the
    checkpoint format follow from it.

    Attributes:
        compile: compile the model with ``torch.compile`` (in place: parameter names, checkpoints
            and exported weights stay those of the eager model); under ``strategy=fsdp``, each of
            the model's units, before it is sharded. The first steps take longer while graphs
            are compiled; on a CPU, inductor needs a C++ compiler (``$CXX``, else ``g++``).
        compile_mode: ``torch.compile`` mode: ``default``, ``reduce-overhead`` (CUDA graphs),
            ``max-autotune`` or ``max-autotune-no-cudagraphs``.
    """

    kind: ClassVar[str] = "strategy"
    shards_parameters: ClassVar[bool] = False
    max_world_size: ClassVar[int | None] = None

    compile: bool = False
    compile_mode: str = "default"

    def memory_layout(self) -> MemoryLayout:
        """Where this strategy keeps parameters, gradients, optimizer state and activations."""
        return MemoryLayout(shards_parameters=self.shards_parameters)

    def mesh(self, world_size: int) -> MeshShape:
        """The mesh dimensions for *world_size* processes: all data-parallel by default (shard or replicate)."""
        if self.shards_parameters:
            return MeshShape(shard=world_size)
        return MeshShape(replicate=world_size)

    def collective_timeout(self) -> float | None:
        """Seconds a collective may wait before the job fails instead of hanging; None: torch's default."""
        return None

    def build(self, *, accelerator: str, precision: PrecisionBlock, world_size: int, io: Any = None) -> Any:
        """The ``strategy`` argument for ``lightning.Trainer``; imports Lightning lazily.

        *io* is the checkpoint plugin (``blocks.checkpoint.io.FsspecCheckpointIO``) the strategy
        saves and loads through.
        """
        raise NotImplementedError

    def lightning_precision(self, precision: PrecisionBlock) -> str:
        """The ``precision`` argument for ``lightning.Trainer`` under this strategy."""
        return precision.lightning

    def forward_parameter_dtype(self, precision: PrecisionBlock) -> str | None:
        """The dtype this strategy itself casts parameters (and floating inputs) to for the forward, or None.

        None: Lightning's precision plugin (:meth:`lightning_precision`) decides how the forward
        computes. ``blocks eval`` reads it to score a model with the numerics its validation had.
        """
        return None

    def parallelizer(self, *, precision: PrecisionBlock, units: str | None) -> Callable[..., None] | None:
        """A function ``(model, device_mesh)`` that parallelizes the model in place, or None.

        With ``strategy.compile`` the whole model is compiled after it; a function that also takes
        ``compile_mode`` (None: eager) compiles what it parallelizes itself, as FSDP's compiles each
        unit before sharding it.
        """
        return None

    def callbacks(self, *, accumulate: int) -> list[Any]:
        """Lightning callbacks this strategy needs (e.g. to control gradient sync)."""
        return []

    def check(self, ctx: CheckContext) -> None:
        """World size within what this strategy runs; a known compile mode that fits the accelerator; a C++ compiler for compiling on a CPU."""
        ctx.choice("compile_mode", self.compile_mode, COMPILE_MODES)
        if self.compile and ctx.derived.accelerator == "cpu":
            self._check_cxx(ctx)
            if self.compile_mode == "reduce-overhead":
                ctx.warning(
                    "compile_mode",
                    "reduce-overhead replays CUDA graphs, but the job runs on CPU: it compiles as default does",
                    "strategy.compile_mode=default (or trainer.accelerator=gpu)",
                    check="compile-mode-accelerator",
                    related=("trainer.accelerator",),
                )
        limit = self.max_world_size
        world = ctx.derived.world_size
        if limit is not None and world > limit:
            ctx.error(
                "",
                f"strategy={self.block_name} runs {limit} process, but trainer.devices × trainer.nodes = {world}",
                "strategy=ddp (or strategy=fsdp), or trainer.devices=1 trainer.nodes=1",
                check="strategy-world-size",
                related=("trainer.devices", "trainer.nodes"),
            )

    def _check_cxx(self, ctx: CheckContext) -> None:
        """Inductor compiles CPU kernels with a C++ compiler: without one the job dies at its first forward.

        An error when the job runs here; a warning when its workers run on the Ray cluster at
        ``$RAY_ADDRESS``, whose machines may have one (a sweep on a launcher that runs elsewhere warns too, see
        :func:`blocks.core.jobs.plan_job`).
        """
        if has_inductor_cxx():
            return
        compiler = inductor_cxx()
        fix = "strategy.compile=false, or install a C++ compiler (g++) or set CXX to one"
        # with RAY_ADDRESS the workers run on that cluster; without it, on a local Ray instance: here
        if cast("TrainerBlock", ctx.block("trainer")).launcher == "ray" and os.environ.get("RAY_ADDRESS"):
            message = f"compiles on CPU with a C++ compiler, but this machine has no {compiler!r} on PATH; the job fails unless the Ray workers' machines have one"
            ctx.warning("compile", message, fix, check="compile-cxx", related=("trainer.launcher",))
            return
        message = f"compiles on CPU with a C++ compiler, but {compiler!r} is not on PATH; the job would fail at its first forward"
        ctx.error("compile", message, fix, check="compile-cxx", related=("trainer.accelerator",))
