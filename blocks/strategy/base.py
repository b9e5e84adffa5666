"""The strategy kind: how the model and its training are spread over processes and devices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from blocks.core.block import Block

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext
    from blocks.precision.base import PrecisionBlock


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""The modes of ``torch.compile``."""


@dataclass(frozen=True, kw_only=True)
class StrategyBlock(Block):
    """Base of strategy blocks.

    ``shards_parameters`` says whether parameters, gradients and optimizer state are split
    across processes (FSDP) or replicated (DDP, single); the plan's memory estimate and the
    checkpoint format follow from it.

    Attributes:
        compile: compile the model with ``torch.compile`` (in place: parameter names, checkpoints
            and exported weights stay those of the eager model). The first steps take longer
            while graphs are compiled; on a CPU, inductor needs a C compiler.
        compile_mode: ``torch.compile`` mode: ``default``, ``reduce-overhead`` (CUDA graphs),
            ``max-autotune`` or ``max-autotune-no-cudagraphs``.
    """

    kind: ClassVar[str] = "strategy"
    shards_parameters: ClassVar[bool] = False
    max_world_size: ClassVar[int | None] = None

    compile: bool = False
    compile_mode: str = "default"

    def build(self, *, accelerator: str, precision: PrecisionBlock, world_size: int, io: Any = None) -> Any:
        """The ``strategy`` argument for ``lightning.Trainer``; imports Lightning lazily.

        *io* is the checkpoint plugin (``blocks.checkpoint.io.FsspecCheckpointIO``) the strategy
        saves and loads through.
        """
        raise NotImplementedError

    def lightning_precision(self, precision: PrecisionBlock) -> str:
        """The ``precision`` argument for ``lightning.Trainer`` under this strategy."""
        return precision.lightning

    def parallelizer(self, *, precision: PrecisionBlock, units: str | None) -> Callable[..., None] | None:
        """A function ``(model, device_mesh)`` that parallelizes the model in place, or None."""
        return None

    def callbacks(self, *, accumulate: int) -> list[Any]:
        """Lightning callbacks this strategy needs (e.g. to control gradient sync)."""
        return []

    def check(self, ctx: CheckContext) -> None:
        """World size within what this strategy runs; a known compile mode."""
        ctx.choice("compile_mode", self.compile_mode, COMPILE_MODES)
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
