"""``blocks eval``: the validation (or test) metrics of a trained model (run dir, checkpoint or export) on a data block."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from blocks.checkpoint.sources import Weights
from blocks.core.compose import BLOCK_KEY, block_node, config_to_blocks
from blocks.core.jobs import plan_blocks
from blocks.core.masking import hide_environment_values_in_overrides
from blocks.data.base import SPLITS, DataBlock
from blocks.launch.collector import collection_paused
from blocks.spec.errors import BlocksError, Problem

if TYPE_CHECKING:
    import torch
    from pytorch_lightning.plugins.precision import Precision

    from blocks.core.plan import Derived, Plan


def eval_config(trained: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """A copy of a run's config *trained* with *overrides*: ``data=NAME`` swaps the data block, ``data.KEY=V`` sets a field."""
    from blocks.spec.registry import REGISTRY

    hide_environment_values_in_overrides(overrides)  # building the config may quote a value read
    config = copy.deepcopy(trained)
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key:
            raise BlocksError(
                Problem(override, "is not KEY=VALUE", "e.g. data.batch_size=256 or data=digits")
            )
        if "." not in key:
            try:
                cls = REGISTRY.get(key, value).cls
            except BlocksError as exc:
                raise BlocksError(
                    Problem(key, exc.problems[0].message, f"{key}=<a registered {key} block>")
                ) from None
            config[key] = OmegaConf.to_container(block_node(cls()))
        else:
            config.merge_with(OmegaConf.from_dotlist([override]))
    return config


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluation` scored.

    Attributes:
        metrics: ``<split>/<name>`` → value.
        weights: the weights scored (file or checkpoint, and its step).
        notes: what a reader comparing them with the run's ``summary.json`` should know.
    """

    metrics: dict[str, float]
    weights: Weights
    notes: tuple[str, ...] = ()


def evaluate(source: str, overrides: Sequence[str] = (), split: str = "val") -> dict[str, float]:
    """Metrics ``<split>/<name>`` of the model at *source* on its run's data block (with *overrides*)."""
    return evaluation(source, overrides, split).metrics


def evaluation(source: str, overrides: Sequence[str] = (), split: str = "val") -> Evaluation:
    """The metrics of the model at *source* on its run's data block (with *overrides*), and which weights they score."""
    with collection_paused():
        import torch
        from torch.utils.data import DataLoader

        from blocks.checkpoint.sources import find_run_config, find_weights, load_found, refuse_other_samples
        from blocks.core import catalog
        from blocks.runtime.contract import BatchContract, check_split_size
        from blocks.runtime.datamodule import PaddedSplit, collate
        from blocks.runtime.init import load_into
        from blocks.runtime.model_export import package_notes, run_config
        from blocks.runtime.sampler import ShardedBatchSampler

    catalog.load()
    trained = run_config(source)
    _, plan = eval_plan(trained, overrides, split)
    run = run_plan(trained)
    spec = plan.data.batch_spec()
    model = plan.model.replace(init_from=None, freeze=()).build(spec)
    weights = find_weights(source, key="source")
    unchecked = refuse_other_samples(weights, run.data, run.trainer.seed, find_run_config(source))
    load_into(model, load_found(weights, source, key="source"), key="source", source=weights.url)
    objective = plan.task.build(spec)
    accelerator = plan.trainer.accelerator
    device = torch.device("cuda" if torch.cuda.is_available() and accelerator != "cpu" else "cpu")
    # The numerics the run's validation had: Lightning's plugin under the strategy, and the
    # strategy's own casts (FSDP's mixed-precision policy at each of its units), if any.
    precision = precision_plugin(plan.strategy.lightning_precision(plan.precision), device)
    precision.convert_module(model.to(device)).eval()  # in place, like .to()
    precision.convert_module(objective.to(device))
    objective.keep_metrics_float32()
    scored = scored_split(plan, split, run.derived)
    if not (split == "val" and plan.trainer.overfit_batches):
        check_split_size(plan.data, split, scored)
    # As a one-process run's validation loads it: the same batches, their draws (augmentations) seeded alike.
    batches = ShardedBatchSampler(
        len(scored),  # type: ignore[arg-type]  # a data block's datasets have one (build's contract)
        batch_size=plan.data.batch_size,
        rank=0,
        world_size=1,
        seed=run.trainer.seed,
    )
    loader = DataLoader(PaddedSplit(scored), batch_sampler=batches, collate_fn=collate)
    contract = BatchContract.of_run(spec, plan.data, plan.model, objective)
    objective.reset()
    with torch.no_grad(), strategy_casts(plan, model):
        for index, batch in enumerate(loader):
            if index == 0:
                contract.check_batch(batch)
            batch = precision.convert_input({k: v.to(device) for k, v in batch.items()})
            with precision.val_step_context():
                outputs = model(batch["inputs"])
                if index == 0:
                    contract.check_outputs(outputs, batch)
                objective.update(outputs, batch)
    metrics = {f"{split}/{name}": float(value) for name, value in objective.compute().items()}
    notes = (
        subset_note(plan, split, run.derived)
        + ((unchecked,) if unchecked else ())
        + tuple(package_notes(source, plan.blocks, weights.url))
    )
    return Evaluation(metrics, weights, notes)


def run_plan(trained: DictConfig) -> Plan:
    """The plan of the run whose config is *trained*: how it validated, and what its checkpoints trained on.

    Its batch geometry, whatever eval's ``data.batch_size``; its data and ``trainer.seed``.
    """
    return plan_blocks(config_to_blocks(trained), None, check_storage=False, config=trained)


def scored_split(plan: Plan, split: str, run: Derived) -> torch.utils.data.Dataset:
    """The samples *split* stands for in the run (batch geometry *run*): with ``trainer.overfit_batches``, ``val`` is the overfit batches it validated on."""
    plan.data.prepare_node()  # one process scores
    if split == "val" and plan.trainer.overfit_batches:
        from torch.utils.data import Subset

        train = plan.data.build("train")
        return Subset(train, range(overfit_samples(plan, run)))  # as the run's datamodule takes them
    return plan.data.build(split)


def overfit_samples(plan: Plan, run: Derived) -> int:
    """How many samples the overfit batches of a run (batch geometry *run*) with ``trainer.overfit_batches`` hold (its validation set)."""
    return min(plan.derived.train_samples, plan.trainer.overfit_batches * run.global_batch)


def strategy_casts(plan: Plan, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
    """Inside, *model* computes as under the plan's strategy: FSDP's mixed-precision policy without the sharding.

    The parameters are cast for good (buffers are not, as under FSDP); the casts of each FSDP
    unit's inputs (and outputs) end on exit. Nothing for a strategy that casts nothing itself.
    """
    if plan.strategy.forward_parameter_dtype(plan.precision) is None:
        return contextlib.nullcontext()
    from blocks.strategy.parallelize import mixed_precision_policy, policy_without_sharding

    policy = mixed_precision_policy(plan.strategy, plan.precision)
    return policy_without_sharding(model, plan.model.shard_units(), policy)


def precision_plugin(lightning: str, device: torch.device) -> Precision:
    """Lightning's precision plugin for *lightning* (``bf16-true``, ``16-mixed``, ...) on *device*."""
    from pytorch_lightning.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision

    if lightning in ("bf16-true", "16-true"):
        return HalfPrecision(lightning)  # type: ignore[arg-type]
    if lightning in ("bf16-mixed", "16-mixed"):
        return MixedPrecision(lightning, device.type)  # type: ignore[arg-type]
    if lightning == "64-true":
        return DoublePrecision()
    return Precision()


def subset_note(plan: Plan, split: str, run: Derived) -> tuple[str, ...]:
    """A note when the run's validation scored other samples than the split (``trainer.overfit_batches``) or fewer (``trainer.limit_val_batches``).

    *run* is the run's own batch geometry (:func:`run_plan`): an eval ``data.batch_size``
    changes how eval reads the split, not how many samples the run's validation covered.
    """
    overfit = plan.trainer.overfit_batches
    if split == "val" and overfit:
        return (
            f"note: the run trained and validated on its first {overfit} global batch(es) of the train split "
            f"(trainer.overfit_batches={overfit}, {overfit_samples(plan, run)} samples), not on its val split: "
            "this scores those samples, as its summary.json val metrics do "
            "(trainer.overfit_batches=0 scores the val split)",
        )
    limit = plan.trainer.limit_val_batches
    if split != "val" or limit is None:
        return ()
    if limit * run.micro_batch * max(1, run.world_size) >= plan.data.num_samples("val"):
        return ()  # the limit left out nothing
    return (
        f"note: the run validated on its first {limit} val batch(es) per process "
        f"(trainer.limit_val_batches={limit}), so its summary.json val metrics cover a subset; "
        "this scores the whole val split",
    )


def eval_plan(
    trained: DictConfig, overrides: Sequence[str], split: str, split_key: str = "--split"
) -> tuple[DictConfig, Plan]:
    """The config and checked plan of scoring *split* of a run whose config is *trained*, with *overrides*.

    Raises :class:`BlocksError` for an unknown split, a split with no samples, a bad override or
    a plan with errors; *split_key* is where the split was chosen (``--split``, or a pipeline's
    ``split`` of an ``Evaluate`` stage). Needs neither torch nor the run's weights, so a pipeline
    checks its evaluations before any stage runs.
    """
    if split not in SPLITS:
        raise BlocksError(Problem(split_key, f"'{split}' is not a split", f"one of: {', '.join(SPLITS)}"))
    config = eval_config(trained, overrides)
    plan = plan_blocks(
        config_to_blocks(config), None, check_storage=False, config=config
    )  # evaluation resumes nothing
    plan.raise_for_errors()
    if split in ("val", "test"):
        refuse_moved_split(trained, plan.data, split)
    overfit = split == "val" and bool(plan.trainer.overfit_batches)  # scores the overfit batches instead
    if plan.data.num_samples(split) == 0 and not overfit:
        raise BlocksError(empty_split(split, str(config.data[BLOCK_KEY]), plan.data, split_key))
    return config, plan


def empty_split(split: str, name: str, data: object, split_key: str = "--split") -> Problem:
    """The problem of scoring a split *data* does not have, with the field that would give it one.

    *split_key* is where the split was chosen: the fix names another split the same way.
    """

    def other(choice: str) -> str:
        return f"--split {choice}" if split_key == "--split" else f"{split_key}='{choice}'"

    field = {"val": "val_fraction", "test": "test_fraction"}.get(split, "")
    if split == "test" and hasattr(data, "test_samples"):
        fix = "declare data.test_samples=<size of the datamodule's test set> (it needs a test_dataloader())"
    elif field and hasattr(data, field):  # the run trained on every sample: any held-out split was trained on
        fix = f"data.{field}=0.1 at train time, then train and evaluate again"
        fix += f" (or {other('val')})" if split == "test" else ""
    else:
        fix = (
            f"{other('val')}, or data=<a data block with a test split>" if split == "test" else other("train")
        )
    return Problem(
        split_key, f"data={name} has no {split} split (0 samples)", fix, check="eval-split-samples"
    )


def refuse_moved_split(run: DictConfig, data: DataBlock, split: str) -> None:
    """Refuse changing a field that decides the split of the run (config *run*) on its own data: *split* would hold samples it trained on.

    The fields are the data block's :meth:`~blocks.data.base.DataBlock.split_defining_fields`
    (``seed``, ``val_fraction``, ``test_fraction``, ...); another data block is other data.
    """
    trained = config_to_blocks(run).get("data")
    if not isinstance(trained, DataBlock) or type(trained) is not type(data):
        return
    for name in data.split_defining_fields():
        before, after = getattr(trained, name), getattr(data, name)
        if before != after:
            raise BlocksError(
                Problem(
                    f"data.{name}",
                    f"is {after} but the run trained with {before}: the {split} split would include "
                    "samples the model saw in training",
                    f"drop the override (--split {split} scores the run's own held-out samples with "
                    f"data.{name}={before}), or train again with the split you want to score",
                    check="eval-split",
                )
            )
