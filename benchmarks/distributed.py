"""Distributed: 2-process DDP and FSDP through blocks vs a raw ``torch.distributed`` loop; 1 → 2 scaling.

Both sides train the same decoder on 2 CPU processes with gloo, one thread each. blocks'
throughput is the median ``samples_per_s`` of ``metrics.csv`` rows after the first (which
includes warmup); the raw loop times the steps after its warmup.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import REPO, Figure, interleaved, judged, median_ratio, python, rounded, with_checkout

LOG_EVERY = 10
SIZES = {"d_model": 128, "layers": 4, "heads": 4, "seq": 64, "batch": 16}
THREADS = {"OMP_NUM_THREADS": "1"}


def blocks_overrides(steps: int) -> list[str]:
    """``tiny_lm`` at the benchmark's sizes, without clipping, schedule, validation or checkpoints."""
    return [
        "recipe=tiny_lm",
        "data.level=byte",
        f"data.seq_len={SIZES['seq']}",
        f"data.batch_size={SIZES['batch']}",
        f"model.d_model={SIZES['d_model']}",
        f"model.n_layers={SIZES['layers']}",
        f"model.n_heads={SIZES['heads']}",
        f"model.context={SIZES['seq']}",
        "optim.grad_clip=null",
        "optim.schedule=constant",
        "optim.warmup_steps=0",
        f"trainer.max_steps={steps}",
        "trainer.val_every=null",
        "checkpoint.enabled=false",
        f"monitor.log_every_n_steps={LOG_EVERY}",
        "monitor.progress=off",
    ]


def through_blocks(extra: list[str], steps: int, root: Path) -> float:
    """Median logged samples/s of a ``blocks run`` (after the first logging window)."""
    import os

    run_dir = Path(tempfile.mkdtemp(dir=root))
    args = python("-m", "blocks", "run", *blocks_overrides(steps), *extra, f"hydra.run.dir={run_dir}")
    proc = subprocess.run(args, cwd=root, capture_output=True, text=True, env={**os.environ, **THREADS})
    if proc.returncode != 0:
        raise RuntimeError(f"blocks run failed:\n{proc.stderr[-3000:]}")
    with (run_dir / "metrics.csv").open() as fh:
        rates = [float(row["samples_per_s"]) for row in csv.DictReader(fh) if row.get("samples_per_s")]
    return statistics.median(rates[1:])


def raw(mode: str, steps: int, vocab: int, root: Path) -> float:
    """Global samples/s of the raw loop on 2 processes."""
    import os

    script = REPO / "benchmarks" / "scripts" / "raw_distributed.py"
    sizes = [f"--{k.replace('_', '-')}={v}" for k, v in SIZES.items()]
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(script),
        f"--mode={mode}",
        f"--steps={steps}",
        f"--warmup={LOG_EVERY}",
        f"--vocab={vocab}",
        *sizes,
    ]
    proc = subprocess.run(
        args, cwd=root, capture_output=True, text=True, env=with_checkout({**os.environ, **THREADS})
    )
    if proc.returncode != 0:
        raise RuntimeError(f"raw {mode} loop failed:\n{proc.stderr[-3000:]}")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("{"))
    return float(json.loads(line)["samples_per_s"])


def run(quick: bool, root: Path) -> list[Figure]:
    """DDP and FSDP ratios against the raw loop, and blocks' 1 → 2 process scaling."""
    steps = 50 if quick else 150
    vocab = 256  # data.level=byte
    two = ["trainer.devices=2"]
    samples = interleaved(
        {
            "blocks_single": lambda: through_blocks([], steps, root),
            "blocks_ddp": lambda: through_blocks(["strategy=ddp", *two], steps, root),
            "raw_ddp": lambda: raw("ddp", steps, vocab, root),
            "blocks_fsdp": lambda: through_blocks(["strategy=fsdp", *two], steps, root),
            "raw_fsdp": lambda: raw("fsdp", steps, vocab, root),
        },
        repeats=2 if quick else 3,
    )
    detail = rounded(samples, 1)
    return [
        judged(
            "distributed",
            "DDP 2 processes: blocks / raw torch.distributed loop",
            median_ratio(samples["blocks_ddp"], samples["raw_ddp"]),
            ">= 0.95",
            **detail,
        ),
        Figure(
            "distributed",
            "FSDP2 2 processes: blocks / raw torch.distributed loop",
            median_ratio(samples["blocks_fsdp"], samples["raw_fsdp"]),
        ),
        Figure(
            "distributed",
            "blocks DDP scaling 1 -> 2 processes (samples/s ratio; 2 would be perfect)",
            median_ratio(samples["blocks_ddp"], samples["blocks_single"]),
        ),
    ]
