"""Plan latency (``blocks plan``, without torch) and time to the first training step vs a Lightning script.

Both sides of the first-step ratio are one-step jobs carrying the same clock callback
(:mod:`benchmarks.first_step_clock`): the judged figure is the time from starting the process to
the end of its first training step; the time to the process's exit (which includes Python's last
garbage collections: about a second after importing Lightning, which ``blocks`` skips) is reported
beside it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchmarks.harness import (
    REPO,
    Figure,
    compile_bytecode,
    interleaved,
    judged,
    median_ratio,
    python,
    rounded,
    timed_first_step,
    timed_subprocess,
    with_checkout,
)
from benchmarks.overhead import blocks_overrides, workloads
from blocks.spec.imports import ENV_VAR as ALLOW_IMPORTS_ENV
from blocks.spec.kinds import KIND_TABLE

HYDRA_FLOOR = REPO / "benchmarks" / "scripts" / "hydra_compose_floor.py"
"""What any Hydra-based CLI pays before its own work (see the script): the floor under ``blocks plan``."""

SCALE_OUT = [
    "strategy=fsdp",
    "trainer.nodes=16",
    "trainer.devices=8",
    "trainer.accelerator=gpu",
    "data.batch_size=8",
]


def torch_imported_by_plan(cwd: Path) -> bool:
    """Whether ``blocks plan`` imports torch, from Python's own import log (``-X importtime``)."""
    proc = subprocess.run(
        python("-X", "importtime", "-m", "blocks", "plan", *SCALE_OUT),
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode not in (0, 2):
        raise RuntimeError(f"blocks plan failed:\n{proc.stderr[-3000:]}")
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    return bool(imported & {"torch", "pytorch_lightning", "lightning"})


def run(quick: bool, root: Path) -> list[Figure]:
    """``blocks plan`` wall time (default recipe, 128-GPU FSDP) and its Hydra floor; ``blocks run`` to its first step vs Lightning."""
    repeats = 3 if quick else 5
    compile_bytecode()
    interpreter = interleaved({"python": lambda: timed_subprocess(python("-c", "pass"), root)}, repeats)
    floor = [str(HYDRA_FLOOR), str(len(KIND_TABLE))]
    plan_times = interleaved(
        {
            "plan": lambda: timed_subprocess(python("-m", "blocks", "plan", *SCALE_OUT), root),
            "default": lambda: timed_subprocess(python("-m", "blocks", "plan"), root),
            "floor": lambda: timed_subprocess(python(*floor), root),
        },
        repeats,
    )
    startup_s = round(statistics.median(interpreter["python"]), 3)
    figures = [
        judged(
            "plan",
            f"blocks plan, {label} (wall, one process)",
            statistics.median(plan_times[case]),
            target,
            unit="s",
            python_startup_s=startup_s,
        )
        for case, label, target in (
            ("default", "default recipe", "<= 0.3"),
            ("plan", "16 nodes x 8 GPUs FSDP", "<= 1"),
        )
    ]
    floor_s = statistics.median(plan_times["floor"])
    figures += [
        Figure(
            "plan",
            f"floor: a fresh process composing {len(KIND_TABLE)} Hydra groups once and printing a rich panel (wall)",
            floor_s,
            "s",
            detail={"floor_s": [round(v, 3) for v in plan_times["floor"]]},
        ),
        Figure(
            "plan",
            "blocks plan, default recipe, above that floor (wall)",
            statistics.median(plan_times["default"]) - floor_s,
            "s",
        ),
        judged(
            "plan", "blocks plan imports torch or Lightning", float(torch_imported_by_plan(root)), "<= 0", ""
        ),
    ]
    small = workloads(quick)[0]
    script = REPO / "benchmarks" / "scripts" / "lightning_first_step.py"
    # both sides generate a training set of small.samples (blocks_overrides sets data.samples)
    lightning_args = [
        str(n) for n in (small.features, small.hidden[0], small.classes, small.batch, small.samples)
    ]
    env = with_checkout({**os.environ, ALLOW_IMPORTS_ENV: "benchmarks"})
    clock = ["trainer.callbacks=[{_target_: benchmarks.first_step_clock.FirstStepClock}]"]

    def blocks_first_step() -> tuple[float, float]:
        run_dir = tempfile.mkdtemp(dir=root)
        one_step = [*blocks_overrides(small), *clock, "trainer.max_steps=1", f"hydra.run.dir={run_dir}"]
        return timed_first_step(python("-m", "blocks", "run", *one_step), Path(run_dir), env)

    def lightning_first_step() -> tuple[float, float]:
        return timed_first_step(python(str(script), *lightning_args), Path(tempfile.mkdtemp(dir=root)), env)

    timed = interleaved({"blocks": blocks_first_step, "lightning": lightning_first_step}, repeats)
    first = {name: [step for step, _ in values] for name, values in timed.items()}
    whole = {name: [exited for _, exited in values] for name, values in timed.items()}
    figures += [
        judged(
            "plan",
            "time to first step (process start to the end of step 1): blocks run / hand-written Lightning script",
            median_ratio(first["blocks"], first["lightning"]),
            "<= 1.1",
            **rounded(first, 2, "_first_step_s"),
        ),
        Figure(
            "plan",
            "one-step job, start to exit: blocks run / the Lightning script",
            median_ratio(whole["blocks"], whole["lightning"]),
            detail=rounded(whole, 2, "_exit_s"),
        ),
    ]
    return figures
