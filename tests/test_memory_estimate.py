"""The plan's memory estimate against the measured peak memory of real training steps on CPU.

What is measured: the peak of the bytes held by live CPU tensor storages during two full
training steps (forward, loss, backward, AdamW step, zero_grad) of the model the plan sizes,
counting the parameters from the start. A ``TorchDispatchMode`` sees every tensor an operator
returns; each new storage is added when it appears and subtracted when it is freed (a
``weakref.finalize`` on the storage). This is exact for tensor memory and blind to allocator
caching and Python objects, which is why it is used instead of the process RSS (noisy: the
allocator keeps freed pages, imports and threads move it by tens of MiB).

Tolerance: the estimate is within ``TOLERANCE`` (±15 %) of the measured peak, for float32.
"""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from blocks.core import jobs
from blocks.core.checks import CPU

TOLERANCE = 0.15


class PeakTensorMemory(TorchDispatchMode):
    """Tracks the bytes of live CPU tensor storages and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def add(self, tensor: object) -> None:
        """Count *tensor*'s storage once, until it is freed."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            return
        storage = tensor.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self._live:
            return
        self._live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            self.add(leaf)
        return out


def measured_peak(overrides: list[str]) -> tuple[int, int]:
    """(estimated, measured) peak bytes of two training steps of the planned model."""
    plan = jobs.plan(overrides, CPU)
    assert plan.ok, [p.render() for p in plan.errors]
    memory = plan.derived.memory
    assert memory is not None and memory.activations is not None
    spec = plan.data.batch_spec()
    torch.manual_seed(0)
    network = plan.model.build(spec)
    objective = plan.task.build(spec)
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-3)
    batch = next(iter(torch.utils.data.DataLoader(plan.data.build("train"), batch_size=plan.data.batch_size)))
    tracker = PeakTensorMemory()
    for parameter in network.parameters():
        tracker.add(parameter)
    with tracker:
        for _ in range(2):
            loss = objective.loss(network(batch["inputs"]), batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return memory.total, tracker.peak


@pytest.mark.parametrize(
    "overrides",
    [
        ["recipe=tiny_lm"],
        ["model.d_model=64", "model.n_layers=2", "data.seq_len=64", "model.context=64", "data.batch_size=8"],
        ["model.d_model=128", "model.n_layers=4", "data.batch_size=8"],
        ["model.d_model=256", "model.n_layers=2", "model.n_heads=8", "data.batch_size=16"],
        ["recipe=blobs", "model.hidden=[512,512]", "data.batch_size=256"],
    ],
    ids=["tiny_lm", "d64", "d128", "d256", "mlp"],
)
def test_estimate_is_within_tolerance_of_measured_peak(overrides: list[str]) -> None:
    estimated, measured = measured_peak(overrides)
    assert measured > 0
    error = estimated / measured - 1
    assert abs(error) <= TOLERANCE, f"estimate {estimated:,} B vs measured {measured:,} B ({error:+.1%})"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "overrides",
    [
        [
            "model.d_model=512",
            "model.n_layers=4",
            "model.n_heads=8",
            "data.seq_len=128",
            "data.batch_size=32",
        ],
        [
            "model.d_model=1024",
            "model.n_layers=2",
            "model.n_heads=16",
            "data.seq_len=128",
            "data.batch_size=16",
        ],
    ],
    ids=["d512", "d1024"],
)
def test_estimate_against_the_cuda_allocator_peak(overrides: list[str]) -> None:
    """On a GPU: the CUDA caching allocator's own peak (``max_memory_allocated``), float32, ±20 %."""
    from blocks.core.environment import Environment

    gpu = Environment(gpus=1, gpu_memory_bytes=torch.cuda.get_device_properties(0).total_memory)
    plan = jobs.plan([*overrides, "model.context=128", "trainer.accelerator=gpu"], gpu)
    assert plan.ok, [p.render() for p in plan.errors]
    assert plan.derived.memory is not None
    spec = plan.data.batch_spec()
    network = plan.model.build(spec).cuda()
    objective = plan.task.build(spec).cuda()
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-3)
    batch = next(iter(torch.utils.data.DataLoader(plan.data.build("train"), batch_size=plan.data.batch_size)))
    batch = {k: v.cuda() for k, v in batch.items()}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        objective.loss(network(batch["inputs"]), batch).backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated()
    estimated = plan.derived.memory.total
    error = estimated / measured - 1
    assert abs(error) <= 0.20, f"estimate {estimated:,} B vs measured {measured:,} B ({error:+.1%})"
