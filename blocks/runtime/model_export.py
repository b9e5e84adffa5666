"""``blocks export``: a trained model as ``model.safetensors`` plus ``model.json`` (its model block and batch spec).

An export loads back with :func:`blocks.load_model` alone: no Lightning, no trainer, no run dir.
The run's full ``config.yaml`` is copied alongside, so ``blocks eval`` works on an export too.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml
from fsspec.core import url_to_fs
from omegaconf import DictConfig, OmegaConf

from blocks.checkpoint.sources import find_run_config, load_weights
from blocks.core.compose import BLOCK_KEY, config_to_blocks
from blocks.core.run_files import CONFIG_FILE, WEIGHTS_FILE
from blocks.data.base import BatchSpec
from blocks.spec.errors import BlocksError, Problem

FORMAT = "blocks-model/1"
MODEL_FILE = "model.json"


def spec_to_json(spec: BatchSpec) -> dict[str, Any]:
    """A batch spec as ``{"type": ..., fields...}``."""
    return {"type": type(spec).__name__, **dataclasses.asdict(spec)}


def run_config(source: str) -> DictConfig:
    """The frozen config of the run *source* belongs to."""
    path = find_run_config(source)
    fs, root = url_to_fs(path)
    try:
        config = OmegaConf.create(fs.cat_file(root).decode())
    except yaml.YAMLError as exc:
        raise BlocksError(
            Problem(
                "source",
                f"{path} is not a config blocks wrote: {exc}",
                "pass a run dir, checkpoint or export of blocks run",
            )
        ) from None
    if not isinstance(config, DictConfig):
        raise BlocksError(
            Problem(
                "source",
                f"{path} holds no mapping of blocks",
                "pass a run dir, checkpoint or export of blocks run",
            )
        )
    return config


def export_model(source: str, out: Path) -> Path:
    """Write the model of *source* (run dir, checkpoint or export) to the directory *out*; returns *out*."""
    from blocks.checkpoint.weights import save_weights
    from blocks.core import catalog

    catalog.load()
    config = run_config(source)
    blocks = config_to_blocks(config)
    model = blocks["model"].replace(init_from=None, freeze=())
    blocks["data"].prepare()  # type: ignore[attr-defined]  # data=stream's source, if its cache was cleared
    spec = blocks["data"].batch_spec()  # type: ignore[attr-defined]
    weights = load_weights(source, key="source")
    out.mkdir(parents=True, exist_ok=True)
    save_weights(weights, out / WEIGHTS_FILE)
    node = {BLOCK_KEY: model.block_name, **dataclasses.asdict(model)}
    meta = {"format": FORMAT, "model": node, "batch_spec": spec_to_json(spec), "source": source}
    (out / MODEL_FILE).write_text(json.dumps(meta, indent=2, default=list) + "\n")
    (out / CONFIG_FILE).write_text(OmegaConf.to_yaml(config))
    return out
