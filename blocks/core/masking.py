"""Secrets read from the environment are hidden in the text a process shows people.

:mod:`blocks.core.secrets` keeps ``${oc.env:VAR}`` values out of the config fields a run writes.
A secret can still reach a text on its way: an error that quotes a checkpoint URL, a logger
that fails to reach a server whose URL holds a password. As Airflow's secrets masker does, each
process registers the secrets its config reads from the environment
(:func:`hide_environment_values`) and shows ``${oc.env:NAME}`` in their place in what it prints
(:func:`hiding_output`), in its log records, in uncaught tracebacks, and in the free-text parts
of the files it writes (problem messages, ``summary.json``'s reason): :func:`hidden`.

Only secrets are hidden, because hiding replaces text wherever it appears: an environment value
counts as one when the variable's name or the config key reading it names a secret
(:data:`SECRET_WORDS`: ``WANDB_API_KEY``, ``monitor.logger_args.token``), and so does the
password of a URL read from the environment. A batch size, a path or a flag read from the
environment is shown as it is. Values shorter than :data:`MIN_HIDDEN_LENGTH` are never hidden.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO
from urllib.parse import urlsplit

import yaml
from omegaconf import DictConfig

from blocks.core.secrets import KeyPath, env_interpolations, environment_reads

SECRET_WORDS = (
    "secret",
    "secrets",
    "token",
    "tokens",
    "password",
    "passwords",
    "passwd",
    "pass",
    "passphrase",
    "key",
    "apikey",
    "credential",
    "credentials",
    "authorization",
)
"""Words that make an environment variable's name, or a config key, name a secret: ``WANDB_API_KEY``,
``HF_TOKEN``, ``DB_PASS``, ``monitor.logger_args.token`` (whole words between ``_``, ``.`` or ``-``,
in any case; ``data.tokenizer`` names none)."""
_SECRET_NAME = re.compile(rf"(?<![a-z0-9])(?:{'|'.join(SECRET_WORDS)})(?![a-z0-9])")

MIN_HIDDEN_LENGTH = 8
"""The length from which a secret is hidden: a shorter one could be a word or a number of any text."""

_hidden: dict[str, str] = {}
"""This process's secrets, each with what is shown in its place."""
_pattern: re.Pattern[str] | None = None
"""Any of :data:`_hidden`, longest first, as a whole word; replaced whole, so a thread never sees it change."""
_VARIABLE = re.compile(r"oc\.env\s*:\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1\s*[,}]")
"""The variable an ``oc.env`` call reads: ``${oc.env:NAME}``, ``${ oc.env : 'NAME', default}``."""


def hide_environment_values(config: DictConfig) -> None:
    """From now on in this process, hide each secret *config* reads from the environment.

    Also each string inside a secret that holds YAML (read with ``${oc.decode:${oc.env:...}}``).
    """
    for path, raw in env_interpolations(config).items():
        for call in environment_reads(raw):
            _hide_read(call, path)
    _compile()


def hide_environment_values_in_overrides(overrides: Iterable[str]) -> None:
    """Hide the secrets command-line *overrides* read from the environment, before they are composed.

    An override whose value does not fit its key is reported by the composition, which may quote
    the value read.
    """
    for override in overrides:
        key, _, value = override.partition("=")
        for call in environment_reads(value):
            _hide_read(call, tuple(key.lstrip("+~").split(".")))
    _compile()


def _compile() -> None:
    global _pattern
    if _hidden:
        values = "|".join(re.escape(value) for value in sorted(_hidden, key=len, reverse=True))
        _pattern = re.compile(rf"(?<![A-Za-z0-9_])(?:{values})(?![A-Za-z0-9_])")
        _hide_in_log_records_and_tracebacks()


def _hide_read(call: str, path: KeyPath) -> None:
    match = _VARIABLE.search(call)
    variable = match.group(2) if match else ""
    value = os.environ.get(variable) if variable else None
    if value is None:  # a default used because the variable is unset is no secret
        return
    shown = f"${{oc.env:{variable}}}"
    names = f"{variable} {'.'.join(map(str, path))}".lower()
    if _SECRET_NAME.search(names):
        _hide(value, shown)
        try:
            decoded = yaml.safe_load(value)
        except Exception:  # not YAML (a date out of range raises ValueError, not YAMLError)
            return
        for leaf in _strings(decoded):
            _hide(leaf, shown)
    else:
        try:
            password = urlsplit(value).password
        except ValueError:
            return
        if password:
            _hide(password, shown)


def _hide(value: str, shown: str) -> None:
    if len(value) >= MIN_HIDDEN_LENGTH:
        _hidden.setdefault(value, shown)


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
    """*text* with every secret of this process, as a whole word, replaced by ``${oc.env:NAME}``.

    A whole word: not inside a longer run of letters, digits and ``_`` (``user:SECRET@host`` and
    ``Bearer SECRET`` are hidden; a number or a word that merely holds the secret's text is not).
    """
    pattern = _pattern
    return text if pattern is None else pattern.sub(lambda match: _hidden[match.group(0)], text)


def _hide_in_log_records_and_tracebacks() -> None:
    """Make log records and uncaught tracebacks hide secrets (once per process)."""
    factory = logging.getLogRecordFactory()
    if not getattr(factory, "hides_secrets", False):
        logging.setLogRecordFactory(_hiding_record_factory(factory))
    if not getattr(sys.excepthook, "hides_secrets", False):
        sys.excepthook = _hiding_excepthook(sys.excepthook)
    if not getattr(threading.excepthook, "hides_secrets", False):
        threading.excepthook = _hiding_excepthook(threading.excepthook)


def _hiding_record_factory(factory: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    """*factory* (logging's record factory), making records whose message and traceback hide secrets.

    At the record's making rather than in a handler's filter: Hydra makes its job's log
    handlers anew for each job, after the secrets were registered. A record is changed only
    when it shows a secret.
    """

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit the message: the handler reports that, as always
            return record
        shown = hidden(message)
        if shown != message:
            record.msg, record.args = shown, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            if hidden(text) != text:
                record.exc_text = hidden(text)
        return record

    make.hides_secrets = True  # type: ignore[attr-defined]
    return make


def _hiding_excepthook(hook: Callable[..., Any]) -> Callable[..., Any]:
    """*hook* (``sys.excepthook`` or ``threading.excepthook``), writing through streams that hide secrets."""

    def excepthook(*args: Any) -> Any:
        with hiding_output():
            return hook(*args)

    excepthook.hides_secrets = True  # type: ignore[attr-defined]
    return excepthook


class _HidingStream:
    """A text stream that writes through :func:`hidden`; everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        self.wrapped.write(hidden(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        self.wrapped.writelines(hidden(line) for line in lines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


@contextmanager
def hiding_output() -> Iterator[None]:
    """Hide secrets in everything written to ``sys.stdout`` and ``sys.stderr`` meanwhile.

    Rich consoles, ``print``, tracebacks and log handlers made meanwhile write through the
    wrapped streams. A secret split over two writes, output written by other processes, and
    output C code writes to the file descriptors are not seen: each blocks process wraps its own.
    """
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _HidingStream(sys.stdout), _HidingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
