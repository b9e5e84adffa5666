"""``blocks eval``: the validation (or test) metrics of a trained model (run dir, checkpoint or export) on a data block."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

from blocks.core.compose import BLOCK_KEY, block_node, config_to_blocks
from blocks.core.jobs import plan_blocks
from blocks.core.masking import hide_environment_values_in_overrides
from blocks.core.plan import Plan
from blocks.data.base import SPLITS
from blocks.spec.errors import BlocksError, Problem


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


def evaluate(source: str, overrides: Sequence[str] = (), split: str = "val") -> dict[str, float]:
    """Metrics ``<split>/<name>`` of the model at *source* on its run's data block (with *overrides*)."""
    import torch
    from torch.utils.data import DataLoader

    from blocks.checkpoint.sources import load_weights
    from blocks.core import catalog
    from blocks.runtime.init import load_into
    from blocks.runtime.model_export import run_config

    catalog.load()
    config, plan = eval_plan(run_config(source), overrides, split)
    spec = plan.data.batch_spec()
    model = plan.model.replace(init_from=None, freeze=()).build(spec)
    load_into(model, load_weights(source, key="source"), key="source", source=source)
    objective = plan.task.build(spec)
    accelerator = plan.trainer.accelerator
    device = torch.device("cuda" if torch.cuda.is_available() and accelerator != "cpu" else "cpu")
    model.to(device).eval()
    objective.to(device)
    if plan.data.num_samples(split) == 0:
        raise BlocksError(empty_split(split, str(config.data[BLOCK_KEY]), plan.data))
    loader = DataLoader(plan.data.build(split), batch_size=plan.data.batch_size, shuffle=False)
    objective.reset()
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            objective.update(model(batch["inputs"]), batch)
    return {f"{split}/{name}": float(value) for name, value in objective.compute().items()}


def eval_plan(trained: DictConfig, overrides: Sequence[str], split: str) -> tuple[DictConfig, Plan]:
    """The config and checked plan of scoring *split* of a run whose config is *trained*, with *overrides*.

    Raises :class:`BlocksError` for an unknown split, a bad override or a plan with errors. Needs
    neither torch nor the run's weights, so a pipeline checks its evaluations before any stage runs.
    """
    if split not in SPLITS:
        raise BlocksError(Problem("--split", f"'{split}' is not a split", f"one of: {', '.join(SPLITS)}"))
    config = eval_config(trained, overrides)
    if split == "test":
        refuse_moved_test_split(trained, config)
    plan = plan_blocks(
        config_to_blocks(config), None, check_storage=False, config=config
    )  # evaluation resumes nothing
    plan.raise_for_errors()
    return config, plan


def empty_split(split: str, name: str, data: object) -> Problem:
    """The problem of scoring a split *data* does not have, with the field that would give it one."""
    field = {"val": "val_fraction", "test": "test_fraction"}.get(split, "")
    if split == "test" and hasattr(data, "test_samples"):
        fix = "declare data.test_samples=<size of the datamodule's test set> (it needs a test_dataloader())"
    elif field and hasattr(data, field):
        when = " at train time, then train and evaluate again" if split == "test" else ""
        fix = f"data.{field}=0.1{when} (or --split val)" if split == "test" else f"data.{field}=0.1"
    else:
        fix = "--split val, or data=<a data block with a test split>" if split == "test" else "--split train"
    return Problem("--split", f"data={name} has no {split} split (0 samples)", fix)


def refuse_moved_test_split(run: DictConfig, config: DictConfig) -> None:
    """Refuse a ``data.test_fraction`` override on the run's own data: its test samples were not held out in training."""
    trained = run.get("data", {})
    data = config.get("data", {})
    if trained.get(BLOCK_KEY) != data.get(BLOCK_KEY) or "test_fraction" not in data:
        return
    before, after = trained.get("test_fraction", 0.0), data.get("test_fraction")
    if before != after:
        raise BlocksError(
            Problem(
                "data.test_fraction",
                f"is {after} but the run trained with {before}: the test samples would include "
                "samples the model saw in training",
                f"drop the override (--split test scores the run's own test_fraction={before}), "
                "or train again with data.test_fraction=0.1",
            )
        )
