"""The precision kind: numeric formats for parameters and computation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.spec.block import Block

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext


@dataclass(frozen=True, kw_only=True)
class PrecisionBlock(Block):
    """Base of precision blocks: one source of truth for dtypes, used by Lightning and by FSDP."""

    kind: ClassVar[str] = "precision"
    lightning: ClassVar[str] = "32-true"
    """The value of ``lightning.Trainer(precision=...)``."""
    param_dtype: ClassVar[str] = "float32"
    """Dtype the parameters are stored in."""
    compute_dtype: ClassVar[str] = "float32"
    """Dtype matmuls run in."""
    needs_grad_scaler: ClassVar[bool] = False
    """float16 training needs a gradient scaler (strategies without one refuse it)."""
    accelerators: ClassVar[tuple[str, ...]] = ("cpu", "gpu")
    """Accelerators this precision runs on."""

    def check(self, ctx: CheckContext) -> None:
        """The accelerator must support this precision."""
        accelerator = ctx.derived.accelerator
        if accelerator not in self.accelerators:
            ctx.error(
                "",
                f"precision={self.block_name} needs a {' or '.join(self.accelerators)} accelerator, "
                f"but trainer.accelerator resolves to '{accelerator}'",
                "precision=bf16-mixed (CPUs support bfloat16 autocast) or precision=32-true, "
                "or trainer.accelerator=gpu on a machine with a GPU",
                check="precision-accelerator",
                related=("trainer.accelerator",),
            )
