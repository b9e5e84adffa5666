"""Where a model's starting weights come from: an export, a committed checkpoint or a run dir."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsspec.core import url_to_fs

from blocks.checkpoint import store
from blocks.spec.errors import BlocksError, Problem

if TYPE_CHECKING:
    import torch

WEIGHTS_FILE = "model.safetensors"
RUN_CHECKPOINTS = "checkpoints"


def resolve_weights(source: str, key: str = "model.init_from") -> str:
    """The file or committed checkpoint that *source* names; a clear error naming *key* otherwise.

    *source* is a ``.safetensors`` file, a committed checkpoint (a ``step-N`` directory with
    a manifest), or a run dir: its ``model.safetensors`` when the run completed, else the
    newest committed checkpoint in its ``checkpoint.dir`` (from its ``config.yaml``).
    """
    fs, root = url_to_fs(source)
    if source.endswith(".safetensors"):
        if fs.isfile(root):
            return source
        raise _missing(key, source, "the file does not exist")
    if not fs.isdir(root):
        raise _missing(key, source, "nothing exists there")
    if fs.exists(store.join(root, store.MANIFEST)):
        return source
    if fs.isfile(store.join(root, WEIGHTS_FILE)):
        return store.join(source, WEIGHTS_FILE)
    newest = store.newest_valid(_checkpoint_dir(source))
    if newest is not None:
        return newest.url
    raise _missing(key, source, f"it holds no {WEIGHTS_FILE} and no committed checkpoint")


def _checkpoint_dir(run_dir: str) -> str:
    """The checkpoint directory a run dir's ``config.yaml`` names (default ``<run_dir>/checkpoints``)."""
    fs, root = url_to_fs(run_dir)
    config_path = store.join(root, "config.yaml")
    if fs.isfile(config_path):
        from omegaconf import OmegaConf

        config = OmegaConf.create(fs.cat_file(config_path).decode())
        directory = OmegaConf.select(config, "checkpoint.dir")
        if directory:
            return str(directory)
    return store.join(run_dir, RUN_CHECKPOINTS)


def _missing(key: str, source: str, why: str) -> BlocksError:
    return BlocksError(
        Problem(
            key,
            f"cannot load weights from {source}: {why}",
            f"{key}= a .safetensors file, a committed checkpoint directory, or the run dir of a finished run",
            check="weights-source",
        )
    )


def load_weights(source: str, key: str = "model.init_from") -> dict[str, torch.Tensor]:
    """The model weights at *source* (see :func:`resolve_weights`), as CPU tensors by name."""
    resolved = resolve_weights(source, key)
    if resolved.endswith(".safetensors"):
        from safetensors.torch import load

        fs, root = url_to_fs(resolved)
        return load(fs.cat_file(root))
    from blocks.checkpoint.export import checkpoint_weights

    try:
        return checkpoint_weights(resolved)
    except store.CheckpointError as exc:
        raise _missing(key, source, str(exc)) from None


def find_run_config(source: str, key: str = "source") -> str:
    """The ``config.yaml`` of the run that *source* (a run dir, export, or checkpoint inside a run dir) came from."""
    fs, root = url_to_fs(source)
    candidate = root.rstrip("/")
    for _ in range(3):  # <run>/, <run>/checkpoints/step-N/, <run>/<file>
        path = store.join(candidate, "config.yaml")
        if fs.isfile(path):
            return str(fs.unstrip_protocol(path))
        candidate = candidate.rsplit("/", 1)[0] if "/" in candidate else candidate
    raise BlocksError(
        Problem(
            key,
            f"no config.yaml found at {source} or above it, so its blocks are unknown",
            "pass a run dir, an export directory, or a checkpoint inside a run dir",
            check="weights-source",
        )
    )
