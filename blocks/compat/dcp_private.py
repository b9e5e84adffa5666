"""torch.distributed.checkpoint internals behind one seam; see :mod:`blocks.compat`.

Apart from :mod:`blocks.compat.torch_private` so that only sharded checkpoints import DCP
(about 40 ms of a run's start-up).
"""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

__all__ = ["FsspecReader", "FsspecWriter", "dcp_load_everything", "dcp_metadata_path"]
# FsspecReader, FsspecWriter: DCP's storage reader and writer for any fsspec URL; torch exports
# only the local-path FileSystemReader/Writer.


def dcp_metadata_path(reader: FsspecReader, rank: int | None) -> Any:
    """Where a DCP fsspec *reader* finds the ``.metadata`` file (``FsspecReader._get_metadata_path``)."""
    return reader._get_metadata_path(rank)


def dcp_load_everything(storage_reader: FsspecReader) -> dict[str, Any]:
    """Every entry of a DCP checkpoint, in one process without a process group.

    The same call as torch's public ``dcp_to_torch_save``, which only reads local paths:
    ``_load_state_dict`` with ``_EmptyStateDictLoadPlanner`` and ``no_dist=True``.
    """
    loaded: dict[str, Any] = {}
    _load_state_dict(
        loaded, storage_reader=storage_reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True
    )
    return loaded
