"""GPU: the transformer recipe at a size that fills an NVIDIA GPU, ``bf16-mixed``, under each strategy.

Reports tokens/s, MFU against the bf16 matmul peak measured on the same device, and the
peak memory the run measured next to the plan's per-device estimate. One process per
strategy (the machine may have a single GPU; then ``ddp`` and ``fsdp`` measure their wrappers'
overhead rather than scaling). Must finish within 10 minutes.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Figure, python

SIZES = {"d_model": 1024, "n_layers": 12, "n_heads": 16, "seq_len": 1024, "batch_size": 16}


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


def overrides(strategy: str, steps: int) -> list[str]:
    """A ~150M-parameter decoder on byte-level text, bf16-mixed, no checkpoints."""
    return [
        "recipe=tiny_lm",
        "data.level=byte",
        f"data.seq_len={SIZES['seq_len']}",
        f"data.batch_size={SIZES['batch_size']}",
        f"model.d_model={SIZES['d_model']}",
        f"model.n_layers={SIZES['n_layers']}",
        f"model.n_heads={SIZES['n_heads']}",
        f"model.context={SIZES['seq_len']}",
        "trainer.accelerator=gpu",
        "trainer.devices=1",
        f"trainer.max_steps={steps}",
        "trainer.max_epochs=null",
        "trainer.val_every=null",
        "precision=bf16-mixed",
        f"strategy={strategy}",
        "checkpoint.enabled=false",
        "monitor.log_every_n_steps=10",
        "monitor.progress=off",
    ]


def _column(rows: list[dict[str, str]], *candidates: str) -> list[float]:
    for name in candidates:
        values = [float(row[name]) for row in rows if row.get(name)]
        if values:
            return values
    return []


def _memory_estimate_gb(plan: dict[str, Any]) -> float | None:
    derived = plan.get("derived", {})
    for key, value in derived.items():
        if "memory" in key and isinstance(value, dict):
            total = value.get("total_gb") or value.get("total")
            if isinstance(total, (int, float)):
                return float(total)
        if "memory" in key and isinstance(value, (int, float)):
            return float(value)
    return None


def one_run(strategy: str, steps: int, root: Path) -> dict[str, Any]:
    """Train one configuration; return its throughput, memory and plan."""
    run_dir = Path(tempfile.mkdtemp(dir=root))
    args = python("-m", "blocks", "run", *overrides(strategy, steps), f"hydra.run.dir={run_dir}")
    proc = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=240, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    with (run_dir / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    samples_per_s = statistics.median(_column(rows, "samples_per_s")[1:])
    memory = _column(rows, "peak_memory_gb", "memory/peak_gb", "peak_mem_gb")
    plan = json.loads((run_dir / "plan.json").read_text())
    return {
        "tokens_per_s": samples_per_s * SIZES["seq_len"],
        "parameters": plan["derived"]["parameters"],
        "peak_memory_gb": max(memory) if memory else None,
        "estimate_gb": _memory_estimate_gb(plan),
    }


def run(quick: bool, root: Path) -> list[Figure]:
    """Tokens/s, MFU and memory vs estimate for single, ddp and fsdp."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--gpu needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    peak = matmul_peak_tflops()
    figures = [Figure("gpu", f"bf16 matmul peak, {torch.cuda.get_device_name()}", peak, unit=" TFLOP/s")]
    layers, d, seq = SIZES["n_layers"], SIZES["d_model"], SIZES["seq_len"]
    for strategy in ("single", "ddp", "fsdp"):
        result = one_run(strategy, 40 if quick else 80, root)
        if "error" in result:
            figures.append(Figure("gpu", f"{strategy}: failed", 0.0, unit="", detail=result))
            continue
        flops_per_token = 6 * result["parameters"] + 12 * layers * d * seq
        mfu = result["tokens_per_s"] * flops_per_token / (peak * 1e12)
        figures += [
            Figure("gpu", f"{strategy} bf16-mixed: tokens/s", result["tokens_per_s"], unit="", detail=result),
            Figure("gpu", f"{strategy} bf16-mixed: MFU vs measured peak", mfu, unit=""),
        ]
        if result["peak_memory_gb"] and result["estimate_gb"]:
            figures.append(
                Figure(
                    "gpu",
                    f"{strategy}: measured peak memory / plan estimate",
                    result["peak_memory_gb"] / result["estimate_gb"],
                )
            )
    return figures
