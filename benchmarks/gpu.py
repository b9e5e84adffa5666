"""GPU: GPT-style decoders of ~125M and ~1B parameters on one NVIDIA GPU (``python -m benchmarks --gpu``).

Every configuration — size × precision (``bf16-mixed``, ``bf16-true``) × eager/compiled
(``strategy.compile``) — trains as its own ``blocks run`` process on one GPU. Reported per
configuration: steady-state tokens/s (``summary.json``'s ``steady_tokens_per_s``), MFU against
the H200's dense bf16 peak (and against a matmul peak measured on the same device), and the
measured peak memory against the plan's estimate. The 125M model also saves a checkpoint and
resumes from it: the save stall and the resumed run's time to its first step.

The whole suite must finish in under 8 minutes on one H200: configurations that would start
after :data:`BUDGET_S` are reported as skipped rather than overrunning. ``--dry-run`` plans
every configuration on any machine (no GPU needed) and prints the commands it would run.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import Figure, python, with_checkout

BUDGET_S = 7 * 60
"""Seconds after which no new configuration starts (the suite must end within 8 minutes)."""
H200_BF16_PEAK_TFLOPS = 989.0


@dataclass(frozen=True)
class Size:
    """A decoder size: ``12 · n_layers · d_model²`` parameters plus embeddings (byte-level vocabulary)."""

    label: str
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    batch_size: int
    steps: int


SIZES = (
    Size("125M", d_model=768, n_layers=18, n_heads=12, seq_len=1024, batch_size=32, steps=40),
    Size("1B", d_model=2048, n_layers=20, n_heads=16, seq_len=2048, batch_size=8, steps=30),
)
PRECISIONS = ("bf16-mixed", "bf16-true")
LOG_EVERY = 5


@dataclass(frozen=True)
class Config:
    """One measured configuration."""

    size: Size
    precision: str
    compiled: bool

    @property
    def label(self) -> str:
        """``1B bf16-true compiled``."""
        return f"{self.size.label} {self.precision} {'compiled' if self.compiled else 'eager'}"


def configs() -> list[Config]:
    """Every configuration: the judged ones (the large model compiled) first, then the rest cheapest first.

    A run past the time budget is skipped, so a slow compile costs the least informative ones.
    """
    every = [
        Config(size, precision, compiled)
        for size in SIZES
        for compiled in (False, True)
        for precision in PRECISIONS
    ]
    judged = [config for config in every if config.size is SIZES[-1] and config.compiled]
    return judged + [config for config in every if config not in judged]


def overrides(config: Config, *, steps: int | None = None, checkpoint: bool = False) -> list[str]:
    """``blocks run`` overrides of *config* (byte-level text, one GPU, no validation, no weights export)."""
    size = config.size
    return [
        "recipe=tiny_lm",
        "data.level=byte",
        "data.val_fraction=0",  # val_every=null alone validates at every (short) epoch's end
        "optim.lr=3e-4",  # the recipe's 1e-2 is for its tiny model; a 1B model could diverge
        f"data.seq_len={size.seq_len}",
        f"data.batch_size={size.batch_size}",
        f"model.d_model={size.d_model}",
        f"model.n_layers={size.n_layers}",
        f"model.n_heads={size.n_heads}",
        f"model.context={size.seq_len}",
        "trainer.accelerator=gpu",
        "trainer.devices=1",
        f"trainer.max_steps={steps or size.steps}",
        "trainer.max_epochs=null",
        "trainer.val_every=null",
        f"precision={config.precision}",
        "strategy=single",
        f"strategy.compile={str(config.compiled).lower()}",
        f"checkpoint.enabled={str(checkpoint).lower()}",
        "checkpoint.save_weights=false",  # not measured: a 4 GB safetensors export per 1B run
        *([f"checkpoint.every_n_steps={size.steps}", "checkpoint.async_save=false"] if checkpoint else []),
        f"monitor.log_every_n_steps={LOG_EVERY}",
        "monitor.progress=off",
    ]


def flops_per_token(parameters: int, size: Size) -> float:
    """Training FLOPs per token: 6 per parameter plus attention (``12 · layers · d_model · seq_len``)."""
    return 6 * parameters + 12 * size.n_layers * size.d_model * size.seq_len


def memory_ratio(peak_mb: float | None, plan: dict[str, Any]) -> float | None:
    """Measured peak memory over the plan's per-device estimate (``derived.memory.total``, bytes)."""
    memory = (plan.get("derived") or {}).get("memory") or {}
    total = memory.get("total")
    if not peak_mb or not isinstance(total, (int, float)) or not total:
        return None
    return peak_mb * 2**20 / total


def plan_all() -> list[dict[str, Any]]:
    """Plan every configuration in this process (no GPU needed); each with its parameters and memory estimate."""
    from blocks.core.environment import Environment
    from blocks.core.jobs import plan

    h200 = Environment(gpus=1, gpu_memory_bytes=141 * 10**9, host_memory_bytes=2 * 10**12)
    planned = []
    for config in configs():
        planned_config = plan(overrides(config), h200)
        memory = planned_config.derived.memory
        planned.append(
            {
                "config": config.label,
                "overrides": overrides(config),
                "parameters": planned_config.derived.parameters,
                "estimate_gb": memory.total / 1e9 if memory else None,
                "errors": [f"{p.key}: {p.message}" for p in planned_config.errors],
            }
        )
    return planned


def _blocks_run(args: list[str], run_dir: Path, root: Path, timeout: float) -> tuple[dict[str, Any], str]:
    """``blocks run ARGS`` into *run_dir*: its summary, or an empty one and what went wrong (also a time-out)."""
    try:
        proc = subprocess.run(
            python("-m", "blocks", "run", *args, f"hydra.run.dir={run_dir}"),
            cwd=root,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=with_checkout(os.environ),
        )
    except subprocess.TimeoutExpired as exc:
        output = "".join(
            part.decode(errors="replace") if isinstance(part, bytes) else part
            for part in (exc.stdout, exc.stderr)
            if part
        )
        return {}, f"timed out after {timeout:.0f} s (the time budget)\n{output[-2000:]}"
    summary = run_dir / "summary.json"
    if proc.returncode != 0 or not summary.exists():
        return {}, (proc.stdout + proc.stderr)[-2000:]
    return json.loads(summary.read_text()), ""


def one_run(config: Config, root: Path, timeout: float) -> dict[str, Any]:
    """Train *config*; its steady tokens/s, MFU, memory against the estimate, and (125M eager) checkpoint times."""
    run_dir = Path(tempfile.mkdtemp(dir=root))
    checkpoint = config.size is SIZES[0] and not config.compiled and config.precision == PRECISIONS[0]
    summary, error = _blocks_run(overrides(config, checkpoint=checkpoint), run_dir, root, timeout)
    if error:
        return {"error": error}
    plan = json.loads((run_dir / "plan.json").read_text())
    with (run_dir / "metrics.csv").open() as fh:
        peaks = [float(row["peak_memory_mb"]) for row in csv.DictReader(fh) if row.get("peak_memory_mb")]
    parameters = int(plan["derived"]["parameters"])
    tokens_per_s = summary.get("steady_tokens_per_s") or 0.0
    result: dict[str, Any] = {
        "parameters": parameters,
        "tokens_per_s": tokens_per_s,
        "mfu_h200": tokens_per_s * flops_per_token(parameters, config.size) / (H200_BF16_PEAK_TFLOPS * 1e12),
        "peak_memory_mb": max(peaks) if peaks else None,
        "memory_vs_estimate": memory_ratio(max(peaks) if peaks else None, plan),
        "wall_s": summary.get("wall_s"),
    }
    if checkpoint:
        result["save_stall_s"] = summary.get("checkpoint_stall_s")
        started = time.perf_counter()
        resumed, error = _blocks_run(
            overrides(config, steps=config.size.steps + 1, checkpoint=True), run_dir, root, timeout
        )
        result["resume_run_s"] = time.perf_counter() - started if not error else None
        result["resumed_from"] = resumed.get("resumed_from")
    return result


def matmul_peak_tflops() -> float:
    """Measured bf16 dense matmul throughput of this GPU (8192³, median of 20)."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        started = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return 2 * 8192**3 / statistics.median(times) / 1e12


def run(quick: bool, root: Path) -> list[Figure]:
    """Every configuration in turn, within :data:`BUDGET_S`."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--gpu needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    started = time.perf_counter()
    measured = matmul_peak_tflops()
    figures = [Figure("gpu", f"bf16 matmul peak, {torch.cuda.get_device_name()}", measured, unit=" TFLOP/s")]
    for config in configs():
        left = BUDGET_S - (time.perf_counter() - started)
        if left <= 30:
            figures.append(Figure("gpu", f"{config.label}: skipped (time budget)", 0.0, unit=""))
            continue
        result = one_run(config, root, timeout=left)
        if "error" in result:
            figures.append(Figure("gpu", f"{config.label}: failed", 0.0, unit="", detail=result))
            continue
        mfu_target = ">= 0.45" if config.size.label == "1B" and config.compiled else ""
        mfu = result["mfu_h200"]
        figures.append(
            Figure("gpu", f"{config.label}: tokens/s", result["tokens_per_s"], unit="", detail=result)
        )
        if mfu_target:
            from benchmarks.harness import judged

            figures.append(judged("gpu", f"{config.label}: MFU (H200 bf16 peak)", mfu, mfu_target, unit=""))
        else:
            figures.append(Figure("gpu", f"{config.label}: MFU (H200 bf16 peak)", mfu, unit=""))
        figures.append(
            Figure(
                "gpu",
                f"{config.label}: MFU (measured matmul peak)",
                mfu * H200_BF16_PEAK_TFLOPS / measured,
                unit="",
            )
        )
        if result["memory_vs_estimate"] is not None:
            ratio = result["memory_vs_estimate"]
            figures.append(
                Figure(
                    "gpu",
                    f"{config.label}: peak memory / plan estimate",
                    ratio,
                    "x",
                    "0.85-1.15",
                    0.85 <= ratio <= 1.15,
                )
            )
        if "save_stall_s" in result:
            figures.append(
                Figure("gpu", f"{config.label}: checkpoint save (sync)", result["save_stall_s"] or 0.0, "s")
            )
            figures.append(
                Figure(
                    "gpu",
                    f"{config.label}: resumed run, 1 step (process wall)",
                    result["resume_run_s"] or 0.0,
                    "s",
                )
            )
    return figures
