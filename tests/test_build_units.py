"""Small pieces of the build layer that multi-process runs depend on, checked directly."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from blocks.core import jobs
from blocks.monitor.sinks import CsvSink
from blocks.runtime.sampler import GlobalBatchSampler, SeededPermutation, ShardedBatchSampler


def test_every_rank_gets_the_same_number_of_validation_batches() -> None:
    for samples, world, batch in [(10, 8, 4), (65, 2, 32), (1, 4, 2), (100, 3, 7)]:
        shards = [
            ShardedBatchSampler(samples, batch_size=batch, rank=r, world_size=world) for r in range(world)
        ]
        assert len({len(s) for s in shards}) == 1, (samples, world)
        assert len({len(list(s)) for s in shards}) == 1
        positions = [p for s in shards for b in s for p in b]
        assert positions == list(range(len(positions))), "contiguous shards of the padded split, in order"
        assert samples <= len(positions) < samples + world, "less than one position of padding per rank"


@pytest.mark.parametrize(
    "args",
    [
        ["recipe=blobs", "data.samples=70", "data.batch_size=2"],  # 7 samples: world 3 has a batch of padding
        ["data=diabetes", "task=regress", "model=mlp", "data.batch_size=8"],  # 88 samples
        ["recipe=tiny_lm", "data.val_fraction=0.001", "data.batch_size=4"],  # 11 windows
    ],
    ids=["classify", "regress", "lm"],
)
def test_validation_counts_every_sample_once_on_any_number_of_processes(args: list[str]) -> None:
    """The ranks' validation steps together give one process's metrics: the padding is run but not counted."""
    import torch
    from torch.utils.data import DataLoader

    from blocks.runtime.datamodule import VALID, PaddedSplit, collate
    from blocks.runtime.module import BlocksModule

    plan = jobs.plan(args)
    torch.manual_seed(0)
    module = BlocksModule(plan.model, plan.task, plan.optim, plan.data.batch_spec(), total_steps=1)
    dataset, samples = plan.data.build("val"), plan.derived.val_samples
    with torch.no_grad():
        for batch in DataLoader(dataset, batch_size=plan.data.batch_size):
            module.objective.update(module.model(batch["inputs"]), batch)
        single = module.objective.compute()
        for world in (1, 2, 3):
            module.objective.reset()
            counted = []
            for rank in range(world):
                sampler = ShardedBatchSampler(
                    samples, batch_size=plan.data.batch_size, rank=rank, world_size=world
                )
                loader = DataLoader(PaddedSplit(dataset), batch_sampler=sampler, collate_fn=collate)
                for positions, batch in zip(sampler, loader, strict=True):
                    mask = batch.get(VALID, torch.ones(len(positions), dtype=torch.bool)).tolist()
                    counted += [
                        position % samples for position, valid in zip(positions, mask, strict=True) if valid
                    ]
                    module.validation_step(batch, 0)
            assert sorted(counted) == list(range(samples)), (
                f"world {world}: every sample counted exactly once"
            )
            torch.testing.assert_close(
                module.objective.compute(), single, rtol=1e-5, atol=1e-6, msg=str(world)
            )


def test_resume_continues_the_saved_epoch_even_if_iteration_starts_first() -> None:
    """Lightning may build the iterator before set_epoch on a resume (worker processes start early)."""
    reference = GlobalBatchSampler(
        SeededPermutation(64, seed=3), micro_batch=4, accumulate=1, rank=0, world_size=1
    )
    reference.sampler.set_epoch(1)
    expected = list(reference)[2:]
    resumed = GlobalBatchSampler(
        SeededPermutation(64, seed=3), micro_batch=4, accumulate=1, rank=0, world_size=1
    )
    resumed.resume_at(epoch=1, steps_done=2)
    assert list(resumed) == expected


def test_a_new_metric_on_an_already_flushed_row_gets_its_column(tmp_path: Path) -> None:
    sink = CsvSink(tmp_path / "metrics.csv")
    sink.write(20, {"train/loss": 1.0})
    sink.flush()
    sink.write(20, {"val/loss": 2.0})
    sink.close()
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert rows == [{"step": "20", "train/loss": "1", "val/loss": "2"}]


def test_batched_fetch_gives_the_same_batches_as_sample_by_sample() -> None:
    import torch
    from torch.utils.data import DataLoader, default_collate

    from blocks.data.datasets import TensorPairs, TokenWindows
    from blocks.runtime.datamodule import BatchedFetch, collate

    indices = [7, 0, 3, 3, 12]
    for dataset in (
        TokenWindows(torch.arange(200) % 37, seq_len=9),
        TensorPairs(torch.randn(20, 4), torch.arange(20)),
    ):
        gathered = next(iter(DataLoader(BatchedFetch(dataset), batch_sampler=[indices], collate_fn=collate)))
        plain = next(iter(DataLoader(dataset, batch_sampler=[indices])))  # the datasets stay plain torch
        one_by_one = collate([dataset[i] for i in indices])
        assert gathered.keys() == one_by_one.keys() == plain.keys()
        for key in gathered:
            assert torch.equal(gathered[key], one_by_one[key]), key
            assert torch.equal(plain[key], one_by_one[key]), key
        assert torch.equal(one_by_one["targets"], default_collate([dataset[i]["targets"] for i in indices]))


def test_padding_is_dropped_from_tensors_inside_any_output_or_batch_structure() -> None:
    """A model returning a tuple or dict, or a batch with a non-tensor entry, met ``value[valid]`` directly;
    a batch's per-sample list (collated strings, ragged tensors) keeps one item per sample."""
    import torch

    from blocks.runtime.module import _batch_samples, _samples

    valid = torch.tensor([True, False, True])
    boxes = [torch.zeros(3, 4), torch.zeros(1, 4), torch.zeros(5, 4)]  # ragged: one tensor per sample
    batch = {"inputs": torch.arange(3), "meta": "split-7", "ids": ["a", "b", "c"], "boxes": boxes}
    kept = _batch_samples(batch, valid)
    assert kept["inputs"].tolist() == [0, 2] and kept["meta"] == "split-7" and kept["ids"] == ["a", "c"]
    assert [tuple(b.shape) for b in kept["boxes"]] == [(3, 4), (5, 4)]
    outputs = (
        torch.arange(6).view(3, 2),
        torch.tensor(1.0),
        {"aux": torch.ones(3)},
    )  # a structure, not samples
    logits, scale, extra = _samples(outputs, valid)
    assert logits.tolist() == [[0, 1], [4, 5]] and scale.item() == 1.0 and extra["aux"].tolist() == [1.0, 1.0]


def test_a_dataset_with_its_own_batched_read_is_read_with_it_under_the_batchs_seed() -> None:
    """A dataset's own ``__getitems__`` (torch's batched read, as Hugging Face datasets have) was bypassed
    for a read sample by sample once every training set was fetched with the batch's seed."""
    import torch

    from blocks.runtime.datamodule import BatchedFetch
    from blocks.runtime.sampler import SeededBatch

    class BatchedReads(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.reads: list[list[int]] = []

        def __len__(self) -> int:
            return 10

        def __getitem__(self, index: int) -> dict:
            raise AssertionError("read sample by sample")

        def __getitems__(self, indices: list[int]) -> list[dict]:
            self.reads.append(list(indices))
            return [{"inputs": torch.rand(()), "targets": torch.tensor(i)} for i in indices]

    dataset = BatchedReads()
    first, again = (
        BatchedFetch(dataset).__getitems__(SeededBatch([3, 1], key=(11, "train", 0, 0))) for _ in range(2)
    )
    assert dataset.reads == [[3, 1], [3, 1]]
    assert [s["inputs"] for s in first] == [s["inputs"] for s in again], "drawn from the batch's seed"


def test_only_a_dataset_that_may_draw_is_loaded_under_the_batchs_seed() -> None:
    """Seeding three generators costs ~12 us a batch: blocks' own datasets, which draw nothing, say so."""
    import random

    import torch

    from blocks.data.datasets import TensorPairs
    from blocks.runtime.datamodule import BatchedFetch
    from blocks.runtime.sampler import SeededBatch

    class Drawing(TensorPairs):
        draws_while_loading = True

    batch = SeededBatch([0, 2], key=(5, "train", 0, 0))
    for dataset, seeded in (
        (TensorPairs(torch.zeros(4, 2), torch.arange(4)), False),
        (Drawing(torch.zeros(4, 2), torch.arange(4)), True),
    ):
        random.seed(1234)
        BatchedFetch(dataset).__getitems__(batch)
        assert (random.random() == random.Random(1234).random()) != seeded, type(dataset).__name__
