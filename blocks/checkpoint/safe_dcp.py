"""Read sharded (DCP) checkpoints without unpickling anything but DCP's own metadata and plain data.

torch's ``FileSystemReader`` reads the ``.metadata`` file with plain ``pickle.load`` and the
default load planner reads non-tensor entries with ``torch.load(weights_only=False)``: a
crafted checkpoint would run code on load. :class:`SafeFsspecReader` is the one reader
``blocks`` uses for DCP shards (resume, ``init_from``, ``eval``, ``export``, rollback): it
reads the metadata with :class:`MetadataUnpickler`, which admits only the classes torch
writes there, and checks every non-tensor entry with ``weights_only=True`` before the planner
sees it. Anything else is refused with :class:`~blocks.checkpoint.io.UnsafeCheckpointError`.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from typing import IO, Any, cast

import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from blocks.checkpoint import store
from blocks.checkpoint.io import UnsafeCheckpointError
from blocks.compat.dcp_private import FsspecReader, dcp_metadata_path

METADATA_MODULE = dcp_metadata.__name__
EXTRA_GLOBALS = frozenset(
    {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # how torch pickles a layout (torch.strided) by name
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("collections", "OrderedDict"),
    }
)
"""What a ``.metadata`` pickle references besides the metadata module's classes and torch dtypes."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP ``.metadata``: its dataclasses and enums, torch dtypes and sizes, and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        """The class *module.name* when a DCP metadata pickle may reference it; refuse anything else."""
        if module == METADATA_MODULE:
            obj = getattr(dcp_metadata, name, None)
            if (
                isinstance(obj, type)
                and obj.__module__ == METADATA_MODULE
                and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
            ):
                return obj
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        elif (module, name) in EXTRA_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def load_metadata(stream: IO[bytes], where: str) -> Metadata:
    """The :class:`Metadata` pickled in *stream* (the ``.metadata`` of checkpoint *where*), or a refusal."""
    try:
        metadata = MetadataUnpickler(stream).load()
    except (pickle.UnpicklingError, AttributeError, EOFError, TypeError, ValueError) as exc:
        raise _unsafe(where, ".metadata", exc) from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"{where}: .metadata holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


def _unsafe(where: str, what: str, exc: BaseException) -> UnsafeCheckpointError:
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    return UnsafeCheckpointError(
        f"{where}: {what} holds pickled objects that are not checkpoint data; refusing to load it ({first})"
    )


class _CheckedBytes:
    """A load planner whose non-tensor entries pass ``torch.load(weights_only=True)`` before the real planner reads them."""

    def __init__(self, planner: LoadPlanner, where: str) -> None:
        self._planner = planner
        self._where = where

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Refuse *value* unless it is tensors and plain data; then hand it to the planner."""
        data = value.read()
        try:
            torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise _unsafe(self._where, f"entry {read_item.dest_index.fqn}", exc) from None
        self._planner.load_bytes(read_item, io.BytesIO(data))


def check_sharded(url: str, manifest: store.Manifest) -> None:
    """Refuse the DCP shards of checkpoint *url* before any load starts: unverified, or unpickling code.

    Every file the shards' metadata (read restricted) points at must be one the verified
    *manifest* lists, so that no shard is read unverified; every non-tensor entry must load
    with ``weights_only=True`` (the tensors are left alone). The loads check the entries again
    as they read, so that part only makes the refusal early and plain (torch reports errors
    inside a load wrapped in its own).
    """
    from fsspec.core import url_to_fs
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    fs, root = url_to_fs(store.join(url, store.SHARDS_DIR))
    with fs.open(store.join(root, ".metadata"), "rb") as stream:
        metadata = load_metadata(stream, url)
    storage = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
    unlisted = sorted(
        {
            f"{store.SHARDS_DIR}/{info.relative_path}"
            for info in storage.values()
            if f"{store.SHARDS_DIR}/{getattr(info, 'relative_path', '')}" not in manifest.files
        }
    )
    if unlisted:
        raise store.CheckpointError(
            f"{url}: the shards' metadata names {', '.join(unlisted)}, which the manifest does not "
            "list: the shards cannot be verified"
        )
    for fqn, item in metadata.state_dict_metadata.items():
        if not isinstance(item, BytesStorageMetadata):
            continue
        for index, info in storage.items():
            if getattr(index, "fqn", None) != fqn:
                continue
            if getattr(info, "transform_descriptors", None):
                continue  # read_data checks transformed entries when it has decoded them
            with fs.open(store.join(root, str(info.relative_path)), "rb") as fh:
                fh.seek(int(info.offset))
                data = fh.read(int(info.length))
            try:
                torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as exc:
                raise _unsafe(url, f"entry {fqn}", exc) from None


class SafeFsspecReader(FsspecReader):
    """torch's fsspec DCP reader, with the metadata and non-tensor entries read without running code."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's metadata through :class:`MetadataUnpickler`, then what torch's reader sets on it."""
        with self.fs.create_stream(dcp_metadata_path(self, kwargs.get("rank")), "rb") as stream:
            metadata = load_metadata(cast(IO[bytes], stream), str(self.path))
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the shards; non-tensor entries are checked with ``weights_only=True`` first."""
        checked: Any = _CheckedBytes(planner, str(self.path))
        return super().read_data(plan, checked)
