"""User-facing errors: one class hierarchy, rendered by the CLI without a traceback.

A bug in `blocks` stays an ordinary exception with its traceback; a mistake in a user's
config, recipe or command line is a :class:`BlocksError` that names the key, says what is
wrong and how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong (or worth a warning) with a composition.

    Attributes:
        key: the config key the problem is about, e.g. ``optim.lr`` or ``strategy``.
        message: what is wrong, in one sentence.
        fix: how to fix it, ideally as an override the user can paste.
        severity: ``error`` stops the run; ``warning`` is shown and the run goes on.
        check: a stable name for the check that found it (used in docs and tests).
        related: other keys involved in a contract between blocks.
    """

    key: str
    message: str
    fix: str = ""
    severity: Severity = "error"
    check: str = ""
    related: tuple[str, ...] = ()

    @property
    def is_error(self) -> bool:
        """Whether this problem stops the run."""
        return self.severity == "error"

    def render(self) -> str:
        """One line for a terminal: ``key: message (fix: ...)``."""
        text = f"{self.key}: {self.message}"
        if self.fix:
            text += f"\n    fix: {self.fix}"
        return text

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {
            "severity": self.severity,
            "key": self.key,
            "message": self.message,
            "fix": self.fix,
            "check": self.check,
            "related": list(self.related),
        }


class BlocksError(Exception):
    """Base of every error caused by user input (config, recipe, command line)."""

    exit_code = 2

    def __init__(self, problems: Problem | Sequence[Problem] | str) -> None:
        if isinstance(problems, str):
            problems = [Problem(key="", message=problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__("\n".join(p.render() for p in self.problems))


class ConfigError(BlocksError):
    """The config could not be composed: unknown key or option, wrong type, bad syntax."""


class PlanError(BlocksError):
    """The config composed but the plan found errors; nothing was started."""


class TrainingError(BlocksError):
    """A problem of the user's setup met after training started (e.g. a full checkpoint disk): the run failed.

    Its exit status is 1, as for any failed training: something was trained and ``summary.json``
    says ``failed`` and why.
    """

    exit_code = 1


class RegistryError(BlocksError):
    """A block, recipe or package could not be registered or found."""


class DuplicateName(RegistryError):
    """Two recipes, blocks or presets claim one name; the message names both files."""


def did_you_mean(word: str, candidates: Iterable[str], *, n: int = 3) -> str:
    """A ``did you mean ...?`` phrase for *word*, or an empty string if nothing is close."""
    matches = difflib.get_close_matches(word, list(candidates), n=n, cutoff=0.6)
    if not matches:
        return ""
    quoted = " or ".join(f"'{m}'" for m in matches)
    return f"did you mean {quoted}?"


def problem_list(problems: Iterable[Problem]) -> list[Problem]:
    """Problems sorted errors first, then by key, keeping the order within each key."""
    return sorted(problems, key=lambda p: (not p.is_error, p.key))


@dataclass
class ProblemSink:
    """Collects problems for one block under its config prefix (``optim`` → ``optim.lr``)."""

    prefix: str
    problems: list[Problem] = field(default_factory=list)

    def _key(self, name: str) -> str:
        if not name:
            return self.prefix
        return name if "." in name or not self.prefix else f"{self.prefix}.{name}"

    def error(
        self, name: str, message: str, fix: str = "", *, check: str = "", related: Sequence[str] = ()
    ) -> None:
        """Record an error about field *name* of this block (or a full key with a dot).

        *check* is the stable name of the check (docs and tests refer to it); *related* lists
        the other keys a contract between blocks involves.
        """
        self.problems.append(Problem(self._key(name), message, fix, "error", check, tuple(related)))

    def warning(
        self, name: str, message: str, fix: str = "", *, check: str = "", related: Sequence[str] = ()
    ) -> None:
        """Record a warning about field *name* of this block (or a full key with a dot)."""
        self.problems.append(Problem(self._key(name), message, fix, "warning", check, tuple(related)))

    def positive(self, name: str, value: float | int | None, *, allow_zero: bool = False) -> None:
        """Error unless *value* is > 0 (or >= 0 with ``allow_zero``)."""
        if value is None:
            return
        if value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            self.error(
                name,
                f"must be {bound}, got {value}",
                f"set {self._key(name)} to a value {bound}",
                check="range",
            )

    def choice(self, name: str, value: str, allowed: Sequence[str]) -> None:
        """Error unless *value* is one of *allowed*, with a did-you-mean."""
        if value in allowed:
            return
        hint = did_you_mean(value, allowed)
        self.error(
            name,
            f"'{value}' is not one of {', '.join(allowed)}" + (f"; {hint}" if hint else ""),
            f"{self._key(name)}={(hint.split(chr(39))[1] if hint else allowed[0])}",
            check="choice",
        )

    def within(self, name: str, value: float, low: float, high: float, *, high_open: bool = True) -> None:
        """Error unless ``low <= value < high`` (``<= high`` with ``high_open=False``)."""
        if low <= value < high or (not high_open and value == high):
            return
        interval = f"[{low:g}, {high:g}{')' if high_open else ']'}"
        self.error(
            name,
            f"must be in {interval}, got {value}",
            f"set {self._key(name)} to a value in {interval}",
            check="range",
        )


def describe_exception(exc: BaseException) -> str:
    """One line for a warning: the exception's type and its first line (a ``BlocksError``'s messages)."""
    if isinstance(exc, BlocksError):
        text = "; ".join(problem.message for problem in exc.problems)
    else:
        text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
