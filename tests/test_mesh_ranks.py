"""The plan and the sampler read data-parallel ranks from the strategy's mesh, not the world size (issue 15.3).

A strategy from this module lays 4 processes out as 2 data-parallel ranks × 2 tensor-parallel
ranks. Planned in this process for 4 CPU devices (no processes start): its global
batch counts 2 data-parallel ranks, ``plan.json`` records the mesh, and the sampler built from
that plan gives both ranks of a tensor-parallel group the same samples.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from blocks.core import catalog
from blocks.core.environment import Environment
from blocks.core.jobs import blocks_for
from blocks.core.plan import Plan, make_plan
from blocks.runtime.sampler import GlobalBatchSampler, SeededPermutation, ShardedBatchSampler
from blocks.strategy.base import MeshShape, StrategyBlock

MICRO, ACCUMULATE, WORLD = 4, 3, 4


@dataclass(frozen=True, kw_only=True)
class TensorParallel2(StrategyBlock):
    """Two tensor-parallel ranks per model replica; the rest of the ranks data-parallel."""

    block_name: ClassVar[str] = "test_tensor_parallel_2"

    def mesh(self, world_size: int) -> MeshShape:
        """``world_size / 2`` data-parallel replicas of two tensor-parallel ranks."""
        return MeshShape(replicate=world_size // 2, tensor=2)

    def build(self, **kwargs: Any) -> Any:  # pragma: no cover - planned only
        raise NotImplementedError


@pytest.fixture(scope="module")
def plan() -> Plan:
    catalog.load()
    blocks = blocks_for(
        [
            "recipe=blobs",
            f"data.batch_size={MICRO}",
            f"optim.accumulate={ACCUMULATE}",
            f"trainer.devices={WORLD}",
            "strategy=ddp",
        ]
    )
    blocks["strategy"] = TensorParallel2()
    return make_plan(blocks, None, Environment())


def test_global_batch_counts_data_parallel_ranks_not_processes(plan: Plan) -> None:
    assert plan.ok, plan.errors
    assert plan.derived.world_size == WORLD
    assert plan.derived.mesh == MeshShape(replicate=2, tensor=2)
    assert plan.derived.global_batch == MICRO * ACCUMULATE * 2


def test_the_mesh_is_frozen_into_plan_json(plan: Plan) -> None:
    frozen = json.loads(json.dumps(plan.to_json()))
    assert frozen["derived"]["mesh"] == {"replicate": 2, "shard": 1, "tensor": 2, "pipeline": 1}
    thawed = Plan.thawed(plan.blocks, frozen)
    assert thawed.derived.mesh == plan.derived.mesh
    assert thawed.derived.data_parallel == 2


def test_a_tensor_parallel_group_reads_the_same_samples(plan: Plan) -> None:
    samples = plan.derived.train_samples

    def train_batches(rank: int) -> list[list[int]]:
        return list(GlobalBatchSampler.for_rank(SeededPermutation(samples, seed=7), plan.derived, rank))

    def val_batches(rank: int) -> list[list[int]]:
        return list(ShardedBatchSampler.for_rank(100, plan.derived, rank, batch_size=MICRO))

    ranks = [train_batches(rank) for rank in range(WORLD)]
    assert ranks[0] == ranks[1] and ranks[2] == ranks[3], "tensor-parallel peers read the same micro-batches"
    assert ranks[0] != ranks[2]
    assert val_batches(0) == val_batches(1) != val_batches(2) == val_batches(3)
    # the two data-parallel shares together are each global batch, every sample once
    steps = plan.derived.steps_per_epoch
    assert steps > 0 and len(ranks[0]) == steps * ACCUMULATE
    first_step = [i for micro in range(ACCUMULATE) for rank in (0, 2) for i in ranks[rank][micro]]
    assert len(first_step) == len(set(first_step)) == plan.derived.global_batch


def test_a_mesh_that_does_not_span_the_world_is_an_error(plan: Plan) -> None:
    blocks = dict(plan.blocks)
    blocks["trainer"] = dataclasses.replace(plan.trainer, devices=3)
    replanned = make_plan(blocks, None, Environment())
    (error,) = [p for p in replanned.errors if p.check == "mesh-world-size"]
    assert error.key == "strategy" and "trainer.devices" in error.related
