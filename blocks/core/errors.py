"""Compatibility path: :mod:`blocks.spec.errors` holds this module (the spec base, below every kind)."""

from blocks.spec.errors import (  # noqa: F401
    BlocksError,
    ConfigError,
    PlanError,
    Problem,
    ProblemSink,
    RegistryError,
    Severity,
    describe_exception,
    did_you_mean,
    problem_list,
)
