"""Compatibility path: :mod:`blocks.spec.block` holds this module (the spec base, below every kind)."""

from blocks.spec.block import (
    _ATTR_LINE as _ATTR_LINE,
)
from blocks.spec.block import (  # noqa: F401
    KINDS,
    Block,
    BlockT,
    FieldInfo,
    block_fields,
    non_finite_fields,
    type_name,
)
from blocks.spec.block import (
    _attribute_docs as _attribute_docs,
)
from blocks.spec.block import (
    _is_float_type as _is_float_type,
)
