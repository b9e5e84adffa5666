"""Compatibility path: :mod:`blocks.spec.registry` holds this module (the spec base, below every kind)."""

from blocks.spec.registry import (  # noqa: F401
    REGISTRY,
    B,
    Entry,
    Registry,
    active_registry,
    register,
)
