"""Compatibility path: :mod:`blocks.spec.imports` holds this module (the spec base, below every kind)."""

from blocks.spec.imports import (
    _PATH as _PATH,
)
from blocks.spec.imports import (  # noqa: F401
    ANY_CLASS,
    DENIED_MODULES,
    DENIED_NAMES,
    ENV_VAR,
    OWN_PREFIXES,
    TARGET_KEY,
    Kind,
    allowed_prefixes,
    implicit_prefixes,
    instantiate,
    path_problem,
    refuse_objects,
    resolve,
    subclass_of,
    targets_in,
)
from blocks.spec.imports import (
    _allow_fix as _allow_fix,
)
from blocks.spec.imports import (
    _describe as _describe,
)
from blocks.spec.imports import (
    _import as _import,
)
from blocks.spec.imports import (
    _pyproject_prefixes as _pyproject_prefixes,
)
from blocks.spec.imports import (
    _real_name as _real_name,
)
from blocks.spec.imports import (
    _refusal as _refusal,
)
from blocks.spec.imports import (
    _under as _under,
)
from blocks.spec.imports import (
    nearest_pyproject as nearest_pyproject,
)
