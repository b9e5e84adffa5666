"""Where a model's starting weights come from: an export, a committed checkpoint or a run dir."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsspec.core import url_to_fs

from blocks.checkpoint import store
from blocks.spec.errors import BlocksError, Problem

if TYPE_CHECKING:
    import torch

    from blocks.data.base import DataBlock

WEIGHTS_FILE = "model.safetensors"
COMPLETED_WEIGHTS_FILE = ".completed-model.safetensors"
"""Run-dir names (as :mod:`blocks.core.run_files`, which this layer may not import): a completed run's weights,
and those of the last completed run while a later attempt that has not completed set them aside."""
RUN_CHECKPOINTS = "checkpoints"
EXPORT_FILE = "model.json"
START_FILE = ".resume-start.json"  # blocks.checkpoint.resume.START_FILE: the run dir's last job
STEP_KEY = "step"
"""The safetensors metadata key that holds the optimizer step a weights file was taken after."""
SAMPLES_KEY = "samples"
"""The safetensors metadata key that holds the digests of what decided the samples a weights file was trained on."""


@dataclass(frozen=True)
class Weights:
    """The weights a source resolved to.

    Attributes:
        url: a ``.safetensors`` file or a committed checkpoint directory.
        step: the optimizer step they were taken after (None: a file that does not say).
    """

    url: str
    step: int | None

    def describe(self) -> str:
        """``<url> (step N)``, for what eval and export say they used."""
        return f"{self.url} (step {self.step if self.step is not None else 'unknown'})"


def resolve_weights(source: str, key: str = "model.init_from") -> str:
    """The file or committed checkpoint that *source* names (see :func:`find_weights`)."""
    return find_weights(source, key).url


def find_weights(source: str, key: str = "model.init_from") -> Weights:
    """The file or committed checkpoint that *source* names, with its step; a clear error naming *key* otherwise.

    *source* is a ``.safetensors`` file, a committed checkpoint (a ``step-N`` directory with
    a manifest), an export directory (its ``model.safetensors``), or a run dir: its
    ``model.safetensors`` (or, while a later session that has not completed set it aside,
    :data:`COMPLETED_WEIGHTS_FILE`) unless a newer committed checkpoint of the run exists (one an
    interrupted later session of the same run dir saved), else that newest checkpoint. A run
    dir's checkpoints are those of its own ``checkpoints/`` (also when the run dir was moved)
    or its ``checkpoint.dir``, and only those its last job saved or continued.
    """
    fs, root = url_to_fs(source)
    if source.endswith(".safetensors"):
        if fs.isfile(root):
            return Weights(source, file_step(source))
        raise _missing(key, source, "the file does not exist")
    if not fs.exists(root):
        raise _missing(key, source, "nothing exists there")
    if not fs.isdir(root):
        raise _missing(
            key, source, "it is a file, not a run dir, a checkpoint directory or a .safetensors weights file"
        )
    if fs.exists(store.join(root, store.MANIFEST)):
        try:
            return Weights(source, store.read_manifest(source).step)
        except store.CheckpointError as exc:
            raise _missing(key, source, str(exc)) from None
    weights_file = store.join(source, WEIGHTS_FILE)
    has_file = fs.isfile(store.join(root, WEIGHTS_FILE))
    if has_file and fs.isfile(store.join(root, EXPORT_FILE)):  # an export: its config names the run's dir
        return Weights(weights_file, file_step(weights_file))
    newest = _newest_checkpoint(source, key)
    set_aside = store.join(source, COMPLETED_WEIGHTS_FILE)
    if has_file or fs.isfile(store.join(root, COMPLETED_WEIGHTS_FILE)):
        url = weights_file if has_file else set_aside
        step = file_step(url)
        if step is None and has_file:
            step = _completed_step(source)  # a file written before steps were
        if newest is None or (step is not None and step >= newest.manifest.step):
            return Weights(url, step)
    if newest is not None:
        return Weights(newest.url, newest.manifest.step)
    raise _missing(key, source, f"it holds no {WEIGHTS_FILE} and no committed checkpoint")


def file_step(url: str) -> int | None:
    """The step recorded in the metadata of the safetensors file at *url* (None when it records none)."""
    try:
        return int(_file_metadata(url)[STEP_KEY])
    except (ValueError, TypeError, KeyError):
        return None


def _file_metadata(url: str) -> dict[str, Any]:
    """The metadata in the header of the safetensors file at *url* (empty when it has none or cannot be read)."""
    fs, path = url_to_fs(url)
    try:
        with fs.open(path, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            if size > 100_000_000:
                return {}
            metadata = json.loads(fh.read(size)).get("__metadata__")
    except (OSError, ValueError, TypeError, AttributeError):
        return {}
    return metadata if isinstance(metadata, dict) else {}


def trained_samples(weights: Weights) -> dict[str, str] | None:
    """What decided the samples *weights* were trained on, as :func:`blocks.checkpoint.resume.sample_digests` digests them.

    A checkpoint's manifest holds them among its digests; a weights file (a run's, an export's)
    in its metadata (``samples``). None when a file written before they were records none.
    """
    from blocks.checkpoint.resume import SAMPLE_KEYS

    if not weights.url.endswith(".safetensors"):
        try:
            saved = store.read_manifest(weights.url).block_digests
        except store.CheckpointError:
            return None  # loading it names the problem
        return {k: saved[k] for k in SAMPLE_KEYS if k in saved}
    try:
        recorded = json.loads(_file_metadata(weights.url)[SAMPLES_KEY])
    except (KeyError, ValueError, TypeError):
        return None
    if not isinstance(recorded, dict):
        return None
    return {k: str(v) for k, v in recorded.items() if k in SAMPLE_KEYS}


def _completed_step(run_dir: str) -> int | None:
    """The step of the run dir's ``summary.json`` when it says the run completed (it wrote the weights file then)."""
    data = _read_json(run_dir, "summary.json")
    if data.get("status") == "completed" and isinstance(data.get("global_step"), int):
        return int(data["global_step"])
    return None


def _read_json(run_dir: str, name: str) -> dict[str, Any]:
    fs, root = url_to_fs(run_dir)
    try:
        data = json.loads(fs.cat_file(store.join(root, name)).decode())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _newest_checkpoint(run_dir: str, key: str) -> store.Committed | None:
    """The newest valid checkpoint the run in *run_dir* saved or continued; refused when only another run's are there.

    Its ``checkpoint.dir`` is an absolute path frozen in ``config.yaml``: the run dir's default
    ``<run dir>/checkpoints`` stays there when the run dir is moved, and another run may fill
    it. So the run dir's own ``checkpoints/`` is looked in too, and only checkpoints of the
    run dir's last job (``.resume-start.json``) or of the lineage it continued count.
    """
    frozen = _frozen_checkpoint_dir(run_dir)
    own = store.join(run_dir, RUN_CHECKPOINTS)
    directories = [frozen] if frozen is None or _same_place(frozen, own) else [frozen, own]
    directories = [d for d in directories if d] or [own]
    start = _read_json(run_dir, START_FILE)
    job = start.get("job")
    if not isinstance(job, str) or not job:
        return store.newest_valid(directories[0])  # a run from before jobs were recorded: anything there
    seen = []
    for directory in directories:
        lineage, foreign = (
            [_moved(u, frozen, directory) for u in start.get(k) or []] for k in ("lineage", "foreign")
        )
        found = store.newest_valid(directory, store.Candidates(job, frozenset(lineage), frozenset(foreign)))
        if found is not None:
            return found
        if store.list_dir(directory).committed:
            seen.append(directory)
    if seen:
        raise BlocksError(
            Problem(
                key,
                f"the checkpoints in {' and '.join(seen)} were saved by another run than the one in "
                f"{run_dir} (their manifests name another job): they are not this run's weights",
                f"{key}=<the run dir that saved them>, or {key}=<one of the checkpoint directories "
                "(.../step-N)> to use it anyway",
                check="weights-source",
            )
        )
    return None


def _same_place(a: str, b: str) -> bool:
    """Whether the URLs or paths *a* and *b* name one directory (a relative path and its absolute form do)."""
    (fs_a, path_a), (fs_b, path_b) = url_to_fs(a), url_to_fs(b)
    return fs_a.unstrip_protocol(path_a).rstrip("/") == fs_b.unstrip_protocol(path_b).rstrip("/")


def _moved(url: str, frozen: str | None, directory: str) -> str:
    """*url* of a checkpoint in *frozen*, as it is named in *directory* (the run dir's own, after a move)."""
    if frozen and directory != frozen and str(url).startswith(frozen.rstrip("/") + "/"):
        return directory.rstrip("/") + str(url)[len(frozen.rstrip("/")) :]
    return str(url)


def _frozen_checkpoint_dir(run_dir: str) -> str | None:
    """The ``checkpoint.dir`` the run dir's ``config.yaml`` froze (None when it names none)."""
    fs, root = url_to_fs(run_dir)
    config_path = store.join(root, "config.yaml")
    if not fs.isfile(config_path):
        return None
    from omegaconf import OmegaConf

    try:
        directory = OmegaConf.select(OmegaConf.create(fs.cat_file(config_path).decode()), "checkpoint.dir")
    except Exception:  # not blocks' config: run_config names that problem
        return None
    return str(directory) if directory else None


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
    """The model weights at *source* (see :func:`find_weights`), as CPU tensors by name."""
    return load_found(find_weights(source, key), source, key)


def load_found(weights: Weights, source: str, key: str = "model.init_from") -> dict[str, torch.Tensor]:
    """The tensors of *weights* (what :func:`find_weights` found for *source*), as CPU tensors by name."""
    if weights.url.endswith(".safetensors"):
        from safetensors.torch import load

        fs, root = url_to_fs(weights.url)
        return load(fs.cat_file(root))
    from blocks.checkpoint.export import checkpoint_weights

    try:
        return checkpoint_weights(weights.url)
    except store.CheckpointError as exc:
        raise _missing(key, source, str(exc)) from None


def refuse_other_samples(
    weights: Weights, data: DataBlock, seed: int, config: str, key: str = "source"
) -> str | None:
    """Refuse *weights* trained on other samples than the run config at *config* describes; a note when that is unknown.

    *data* and *seed* (``trainer.seed``) are that config's. A later run in the same run dir
    rewrites ``config.yaml``; with other split fields its val split would hold samples the
    weights trained on. A checkpoint's manifest and a weights file's metadata record digests
    of their own (:func:`trained_samples`). A weights file written before they were recorded
    is scored unchecked: the note returned says so.
    """
    from blocks.checkpoint.resume import COMPARED, sample_digests

    saved = trained_samples(weights)
    if saved is None:
        if not weights.url.endswith(".safetensors"):
            return None
        return (
            f"note: {weights.url} does not record the data it was trained on (written by an older blocks): "
            f"whether the split holds samples it trained on was not checked against {config}"
        )
    now = sample_digests(data, seed)
    differ = [COMPARED[k] for k in now if k in saved and saved[k] != now[k]]
    if differ:
        raise BlocksError(
            Problem(
                key,
                f"{weights.url} was trained with another {' and '.join(differ)} than {config} describes "
                "(a later run in the run dir rewrote it): its splits would hold samples the weights "
                "trained on",
                f"{key}=<a checkpoint or the weights of the run that wrote {config}>, or put back the "
                "config.yaml the weights were trained with",
                check="eval-split",
            )
        )
    return None


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
