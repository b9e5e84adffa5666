"""Values read from the environment are hidden in what a process prints, logs and writes for people.

:mod:`blocks.core.secrets` keeps ``${oc.env:VAR}`` values out of the config fields a run writes.
A value can still reach a text on its way: an error that quotes a checkpoint path, a logger
that fails to reach a URL holding a password. Like a CI system's secret masking (or Airflow's
secrets masker), each process registers the values its config reads from the environment
(:func:`hide_environment_values`), and every text it shows passes through :func:`hidden`:
its output streams (:func:`hiding_output`), its log handlers, ``summary.json`` and
``plan.json``. Each value is replaced by ``${oc.env:NAME}``, which says where it came from.

Not hidden: values shorter than :data:`MIN_HIDDEN_LENGTH` (a seed or a flag would hide every
digit), a default used because the variable is unset, and a value a text shows escaped (JSON
escapes quotes and backslashes in a string).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from blocks.core.secrets import env_interpolations, environment_reads

MIN_HIDDEN_LENGTH = 4
"""The length from which an environment value is hidden."""

_hidden: dict[str, str] = {}
"""This process's environment values, each with what is shown in its place."""
_longest_first: tuple[str, ...] = ()
"""The keys of :data:`_hidden`, longest first; replaced whole, so a thread reading it never sees it change."""


def hide_environment_values(config: DictConfig) -> None:
    """From now on in this process, hide each value *config* reads from the environment.

    Also each string inside a value that holds YAML (read with ``${oc.decode:${oc.env:...}}``).
    Log records made from now on hide them too.
    """
    global _longest_first
    for raw in env_interpolations(config).values():
        for call in environment_reads(raw):
            _hide_read(call)
    _longest_first = tuple(sorted(_hidden, key=len, reverse=True))
    factory = logging.getLogRecordFactory()
    if _hidden and not getattr(factory, "hides_environment_values", False):
        logging.setLogRecordFactory(_hiding_record_factory(factory))


def _hide_read(call: str) -> None:
    try:
        value = OmegaConf.create({"value": call}).value
    except OmegaConfBaseException:  # its argument is another key: the whole config resolves it, not this
        return
    name = next((name for name, env in os.environ.items() if env == value), None)
    if name is None or not isinstance(value, str) or len(value) < MIN_HIDDEN_LENGTH:
        return
    shown = f"${{oc.env:{name}}}"
    _hidden[value] = shown
    try:
        decoded = yaml.safe_load(value)
    except yaml.YAMLError:
        return
    for leaf in _strings(decoded):
        if len(leaf) >= MIN_HIDDEN_LENGTH:
            _hidden.setdefault(leaf, shown)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for child in value.values():
            yield from _strings(child)
    elif isinstance(value, list):
        for child in value:
            yield from _strings(child)
    elif isinstance(value, str):
        yield value


def hidden(text: str) -> str:
    """*text* with every hidden value replaced by ``${oc.env:NAME}`` (longest values first)."""
    for value in _longest_first:
        if value in text:
            text = text.replace(value, _hidden[value])
    return text


def hidden_values(value: Any) -> Any:
    """A JSON-ready *value* with :func:`hidden` applied to every string in it (keys included)."""
    if not _hidden:
        return value
    if isinstance(value, dict):
        return {hidden_values(k): hidden_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [hidden_values(v) for v in value]
    return hidden(value) if isinstance(value, str) else value


def _hiding_record_factory(factory: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    """*factory* (logging's record factory), making records whose message and traceback hide environment values.

    At the record's making rather than in a handler's filter: Hydra makes its job's log
    handlers anew for each job, after the values were registered.
    """

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        if not _hidden:
            return record
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit the message: the handler reports that, as always
            return record
        shown = hidden(message)
        if shown != message:
            record.msg, record.args = shown, None
        if record.exc_info:
            record.exc_text = hidden(logging.Formatter().formatException(record.exc_info))
        return record

    make.hides_environment_values = True  # type: ignore[attr-defined]
    return make


class _HidingStream:
    """A text stream that writes through :func:`hidden`; everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        self.wrapped.write(hidden(text) if _hidden else text)
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


@contextmanager
def hiding_output() -> Iterator[None]:
    """Hide environment values in everything written to ``sys.stdout`` and ``sys.stderr`` meanwhile.

    Rich consoles, ``print``, tracebacks and log handlers made meanwhile write through the
    wrapped streams. Output written by other processes, or by C code to the file descriptors,
    is not seen: each blocks process wraps its own.
    """
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _HidingStream(sys.stdout), _HidingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
