"""Loading an exported model (``blocks export``) back as a plain ``nn.Module``, without any training code."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from blocks.data import base as data_base
from blocks.spec.errors import BlocksError, Problem

if TYPE_CHECKING:
    from torch import nn

_SPECS = {
    cls.__name__: cls for cls in (data_base.TokenBatch, data_base.FeatureBatch, data_base.RegressionBatch)
}


def load_model(path: str | Path) -> nn.Module:
    """The exported model in directory *path* (``model.json`` + ``model.safetensors``), in eval mode on the CPU.

    Example::

        model = blocks.load_model("export/")
        logits = model(torch.rand(1, 64))
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from blocks.core.compose import node_to_block
    from blocks.core.provenance import SOURCES_KEY, refuse_project_blocks_not_loaded, version_notes
    from blocks.spec.registry import REGISTRY

    directory = Path(path)
    meta_file = directory / "model.json"
    if not meta_file.is_file():
        raise BlocksError(
            Problem(
                "path", f"{directory} holds no model.json", "pass the directory that `blocks export` wrote"
            )
        )
    meta = json.loads(meta_file.read_text())
    node = OmegaConf.create(meta["model"])
    name = str(node["_block_"])
    if name not in REGISTRY.names("model"):
        from blocks.core import catalog

        catalog.load()  # a block from an installed package, or the project's
    refuse_project_blocks_not_loaded(meta.get(SOURCES_KEY), {"model": name})
    block = node_to_block("model", node)
    for note in version_notes(
        meta.get(SOURCES_KEY), {"model": block}, what="the exported model was trained with"
    ):
        warnings.warn(note, stacklevel=2)
    spec_json = dict(meta["batch_spec"])
    spec = _SPECS[spec_json.pop("type")](**spec_json)
    module = block.build(spec)  # type: ignore[attr-defined]
    from blocks.runtime.init import load_into

    weights = directory / "model.safetensors"
    try:
        state = load_file(str(weights))
    except (OSError, SafetensorError) as exc:
        raise BlocksError(
            Problem("path", f"cannot read {weights}: {exc}", "export the model again with blocks export")
        ) from None
    load_into(module, state, key="path", source=str(weights))  # a clear error when they do not fit
    return module.eval()
