"""Block field values as JSON: the way OmegaConf writes them into ``config.yaml``."""

from __future__ import annotations

import enum
from pathlib import PurePath
from typing import Any


def json_value(value: Any) -> Any:
    """*value* (a block field, or a dict/list/tuple of them) with only JSON types left.

    An Enum becomes its name and a path its string, as ``config.yaml`` records them (and as a
    config reads them back); a tuple becomes a list. Anything else is returned as it is.
    """
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return json_scalar(value)


def json_scalar(value: Any) -> Any:
    """One non-container value as :func:`json_value` writes it."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, PurePath):
        return str(value)
    return value
