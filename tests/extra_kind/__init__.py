"""A block kind that is not built in (``callbacks``), added by one kind-table entry and this package."""

from blocks.spec.kinds import BlockKind

KIND = BlockKind("callbacks", "tests.extra_kind.base:CallbacksBlock", "none", "extra Lightning callbacks")
"""The kind-table entry of the new kind."""
