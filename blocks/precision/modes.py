"""The four precision blocks: ``32-true``, ``bf16-mixed``, ``16-mixed``, ``bf16-true``."""

from __future__ import annotations

from dataclasses import dataclass

from blocks.precision.base import PrecisionBlock
from blocks.spec.registry import register


@register("32-true")
@dataclass(frozen=True, kw_only=True)
class Float32(PrecisionBlock):
    """Full float32 parameters and computation."""


@register("bf16-mixed")
@dataclass(frozen=True, kw_only=True)
class BF16Mixed(PrecisionBlock):
    """float32 parameters, bfloat16 autocast for computation (CPU and GPU)."""

    lightning = "bf16-mixed"
    compute_dtype = "bfloat16"


@register("16-mixed")
@dataclass(frozen=True, kw_only=True)
class FP16Mixed(PrecisionBlock):
    """float32 parameters, float16 autocast with a gradient scaler (GPU only)."""

    lightning = "16-mixed"
    needs_grad_scaler = True
    compute_dtype = "float16"
    accelerators = ("gpu",)


@register("bf16-true")
@dataclass(frozen=True, kw_only=True)
class BF16True(PrecisionBlock):
    """bfloat16 parameters and computation: half the memory, less accurate updates."""

    lightning = "bf16-true"
    param_dtype = "bfloat16"
    compute_dtype = "bfloat16"
