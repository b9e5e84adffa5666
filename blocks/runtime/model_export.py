"""``blocks export``: a trained model as ``model.safetensors`` plus ``model.json`` (its model block and batch spec).

An export loads back with :func:`blocks.load_model` alone: no Lightning, no trainer, no run dir.
The run's full ``config.yaml`` is copied alongside, so ``blocks eval`` works on an export too.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from fsspec.core import url_to_fs
from omegaconf import DictConfig, OmegaConf

from blocks.checkpoint.sources import find_run_config, find_weights, refuse_other_samples
from blocks.checkpoint.store import PACKAGES_FILE, read_beside
from blocks.core.compose import BLOCK_KEY, config_to_blocks
from blocks.core.provenance import (
    SOURCES_KEY,
    block_sources,
    recorded_sources,
    refuse_project_blocks_not_loaded,
    version_notes,
)
from blocks.core.run_files import CONFIG_FILE, PLAN_FILE, WEIGHTS_FILE
from blocks.data.base import BatchSpec
from blocks.spec.block import KINDS, Block
from blocks.spec.errors import BlocksError, Problem
from blocks.spec.registry import active_registry

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
    unknown = {
        kind: name
        for kind, name in chosen_blocks(config).items()
        if name not in active_registry().names(kind)
    }
    if unknown:
        refuse_project_blocks_not_loaded(run_recorded_packages(path), unknown)
    return config


def chosen_blocks(config: DictConfig) -> dict[str, str]:
    """Each kind's block name in *config* (kinds without one left out)."""
    return {
        kind: str(node[BLOCK_KEY])
        for kind in KINDS
        if isinstance(node := config.get(kind), DictConfig) and BLOCK_KEY in node
    }


def recorded_packages(source: str, weights: str | None = None) -> object:
    """The block distributions and versions the weights of *source* were trained with; None when none were recorded.

    A checkpoint's own record comes first (its ``packages.json``: a later session of the run
    rewrites ``plan.json``), else the run's (``plan.json``, or an export's ``model.json``).
    *weights* is the file or checkpoint *source* resolves to, when the caller has found it.
    """
    url = weights if weights is not None else find_weights(source, key="source").url
    saved = recorded_sources(read_beside(url, PACKAGES_FILE) or "")
    if saved is not None:
        return saved
    return run_recorded_packages(find_run_config(source))


def run_recorded_packages(config: str) -> object:
    """The block distributions the run whose ``config.yaml`` is at *config* recorded (its ``plan.json``, or an export's ``model.json``)."""
    fs, root = url_to_fs(config)
    directory = root.rsplit("/", 1)[0]
    for name in (PLAN_FILE, MODEL_FILE):
        try:
            recorded = recorded_sources(fs.cat_file(f"{directory}/{name}").decode())
        except (OSError, UnicodeDecodeError):
            continue
        if recorded is not None:
            return recorded
    return None


def package_notes(source: str, blocks: Mapping[str, Block], weights: str | None = None) -> list[str]:
    """A note per kind of *blocks* whose block the weights of *source* were trained with at another version than the installed one."""
    return version_notes(recorded_packages(source, weights), blocks)


def export_model(source: str, out: Path) -> Path:
    """Write the model of *source* (run dir, checkpoint or export) to the directory *out*; returns *out*.

    *out* must be new or an empty directory: an export never replaces files. The weights are
    loaded into the model first, so weights that do not fit it are refused before anything is
    written. ``model.json`` names the weights exported (``weights``: file or checkpoint, step) and
    the distribution and version of each block the run used (``packages``).
    """
    from blocks.checkpoint.sources import load_found, trained_samples
    from blocks.checkpoint.weights import save_weights
    from blocks.core import catalog
    from blocks.runtime.init import load_into

    catalog.load()
    refuse_out(out)
    config = run_config(source)
    blocks = config_to_blocks(config)
    model = blocks["model"].replace(init_from=None, freeze=())
    blocks["data"].prepare()  # type: ignore[attr-defined]  # data=stream's source, if its cache was cleared
    spec = blocks["data"].batch_spec()  # type: ignore[attr-defined]
    found = find_weights(source, key="source")
    refuse_other_samples(found, blocks["data"], blocks["trainer"].seed, find_run_config(source))  # type: ignore[arg-type,attr-defined]
    weights = load_found(found, source, key="source")
    load_into(model.build(spec), weights, key="source", source=found.url)  # type: ignore[attr-defined]
    node = {BLOCK_KEY: model.block_name, **dataclasses.asdict(model)}
    exported: dict[str, Any] = {"url": found.url, "step": found.step}
    samples = trained_samples(found)
    if samples is not None:  # what decided the samples it trained on: eval of the export checks them
        exported["samples"] = samples
    meta = {
        "format": FORMAT,
        "model": node,
        "batch_spec": spec_to_json(spec),
        "source": source,
        "weights": exported,
        # the versions the weights were trained with, when the run recorded them
        SOURCES_KEY: recorded_packages(source, found.url) or block_sources(blocks),
    }
    try:
        out.mkdir(parents=True, exist_ok=True)
        save_weights(weights, out / WEIGHTS_FILE, step=found.step, samples=samples)
        (out / MODEL_FILE).write_text(json.dumps(meta, indent=2, default=list) + "\n")
        (out / CONFIG_FILE).write_text(OmegaConf.to_yaml(config))
    except OSError as exc:
        raise BlocksError(
            Problem(
                "OUT",
                f"cannot write the export to {out}: {exc.strerror or exc}",
                "choose a new or empty directory you can write to",
            )
        ) from None
    return out


def refuse_out(out: Path) -> None:
    """Refuse an export directory *out* that is a file or holds files already (a run dir above all)."""
    if out.is_symlink() and not out.exists():
        why = "is a broken link"
    elif out.exists() and not out.is_dir():
        why = "is a file"
    elif out.is_dir() and any(out.iterdir()):
        is_run = (
            (out / "summary.json").exists() or (out / "checkpoints").exists() or (out / CONFIG_FILE).exists()
        )
        why = "is a run dir or an export" if is_run else "is not empty"
    else:
        return
    raise BlocksError(
        Problem(
            "OUT",
            f"{out} {why}: an export writes into a new or empty directory and replaces nothing",
            "choose an empty or new directory",
        )
    )
