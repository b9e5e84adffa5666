"""Learning-rate schedules as pure functions of the step (torch-free, shared by plan and build)."""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "linear", "constant")


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Multiplier of the peak LR at optimizer step *step* (0-based).

    Linear warmup from ``1 / (warmup_steps + 1)`` to 1 over ``warmup_steps``, then ``cosine``
    or ``linear`` decay to ``min_lr_ratio`` at ``total_steps``, or ``constant``.
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    shape = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape
