"""Where the shipped recipes and config presets are, installed or in a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent


def _shipped(installed: str, source: str) -> Path | None:
    """The directory inside the installed package, else the one at the top of the checkout."""
    for candidate in (_PACKAGE / installed, _PACKAGE.parent / source):
        if candidate.is_dir():
            return candidate
    return None


def recipes_dir() -> Path | None:
    """The directory of the shipped recipe files (``recipes/``)."""
    return _shipped("_recipes", "recipes")


def conf_dir() -> Path | None:
    """The directory of the shipped YAML presets (``conf/``)."""
    return _shipped("_conf", "conf")


def shipped_searchpath() -> list[str]:
    """The Hydra search path entries of the shipped presets (``file://<conf>``)."""
    conf = conf_dir()
    return [f"file://{conf}"] if conf is not None else []
