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
(:func:`names_a_secret`: ``WANDB_API_KEY``, ``monitor.logger_args.token``), and so do the parts
of a URL that carry credentials. A batch size, a path or a flag read from the environment is
shown as it is. Secrets shorter than :data:`MIN_HIDDEN_LENGTH` are never hidden, and a secret is
hidden only as a whole word.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO
from urllib.parse import unquote_plus, urlsplit

import yaml
from omegaconf import DictConfig

from blocks.core.secrets import KeyPath, env_interpolations, environment_reads

SECRET_WORDS = (
    "secret",
    "password",
    "passwd",
    "passphrase",
    "credential",
    "apikey",
    "authorization",
    "connection_string",
)
"""Words that make a name a secret's wherever they stand in it: ``AWS_SECRET_ACCESS_KEY``, ``PGPASSWORD``,
``clientSecret``."""
SECRET_WHOLE_WORDS = ("token", "tokens", "key", "pass", "pat")
"""Words that make a name a secret's as whole words: ``HF_TOKEN``, ``WANDB_API_KEY``, ``DB_PASS``,
``GITHUB_PAT``, ``monitor.logger_args.token``; not ``data.tokenizer`` or ``monkey``."""
_SECRET_NAME = re.compile(
    rf"{'|'.join(SECRET_WORDS)}|(?<![a-z0-9])(?:{'|'.join(SECRET_WHOLE_WORDS)})(?![a-z0-9])"
)
_SECRET_QUERY_NAMES = ("sig", "signature")
"""Also secrets in a URL's query: ``?sig=`` (an Azure SAS), ``X-Amz-Signature=``."""
_WORD_START = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
"""Where camelCase starts a word: ``clientSecret``, ``HFToken``, ``OpenAIKey``."""

MIN_HIDDEN_LENGTH = 8
"""The length from which a secret is hidden: a shorter one could be a word or a number of any text."""
MIN_URL_USER_LENGTH = 20
"""The length from which a URL's user name without a password is taken for a token (``https://TOKEN@host``)."""

_hidden: dict[str, str] = {}
"""This process's secrets, each with what is shown in its place."""
_pattern: re.Pattern[str] | None = None
"""Any of :data:`_hidden`, longest first, as a whole word; replaced whole, so a thread never sees it change."""
_VARIABLE = re.compile(r"oc\.env\s*:\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1\s*[,}]")
"""The variable an ``oc.env`` call reads: ``${oc.env:NAME}``, ``${ oc.env : 'NAME', default}``."""


def names_a_secret(name: str) -> bool:
    """Whether a variable's name or a config key names a secret (:data:`SECRET_WORDS`, :data:`SECRET_WHOLE_WORDS`)."""
    return bool(_SECRET_NAME.search(_WORD_START.sub("_", name).lower()))


def hide_environment_values(config: DictConfig) -> dict[KeyPath, str]:
    """From now on in this process, hide each secret *config* reads from the environment.

    Returns what it looked through, :func:`~blocks.core.secrets.env_interpolations` of *config*,
    for a caller that shows those values as their interpolation too.
    """
    found = env_interpolations(config)
    for path, raw in found.items():
        for call in environment_reads(raw):
            _hide_read(call, path)
    _compile()
    return found


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
    if names_a_secret(variable) or any(names_a_secret(str(key)) for key in path):
        _hide(value, shown)
        for leaf in _secret_leaves(value):
            _hide(leaf, shown)
    for part in _url_secrets(value):
        _hide(part, shown)


def _hide(value: str, shown: str) -> None:
    """Hide *value*, also as JSON and Python's ``repr`` write it inside quotes."""
    if len(value) >= MIN_HIDDEN_LENGTH:
        for form in (value, json.dumps(value)[1:-1], repr(value)[1:-1]):
            _hidden.setdefault(form, shown)


def _secret_leaves(value: str) -> list[str]:
    """The secrets inside a secret that holds YAML or JSON.

    The strings under keys that name a secret (a credentials file: ``private_key`` but not
    ``type: service_account``), or every string when no key names one (``{prod: ..., staging: ...}``,
    a list of tokens).
    """
    try:
        decoded = yaml.safe_load(value)
    except Exception:  # not YAML (a date out of range raises ValueError, not YAMLError)
        return []
    if not isinstance(decoded, (dict, list)):
        return []
    named: list[str] = []
    every: list[str] = []
    seen: set[int] = set()
    pending: list[tuple[bool, Any]] = [(False, decoded)]
    while pending:
        secret, node = pending.pop()
        if isinstance(node, (dict, list)):
            if id(node) in seen:  # a YAML alias that holds itself
                continue
            seen.add(id(node))
        if isinstance(node, dict):
            pending += [(secret or names_a_secret(str(key)), child) for key, child in node.items()]
        elif isinstance(node, list):
            pending += [(secret, child) for child in node]
        elif isinstance(node, str):
            (named if secret else every).append(node)
    return named or every


def _url_secrets(value: str) -> list[str]:
    """The password of a URL (or a long user name without one over HTTP), and its query values named as secrets.

    A query value both as written (percent-encoded, as the URL is printed) and decoded.
    """
    try:
        parts = urlsplit(value)
    except ValueError:
        return []
    if not parts.scheme or not parts.netloc:
        return []
    found = []
    for pair in parts.query.split("&"):
        name, _, written = pair.partition("=")
        name = unquote_plus(name)
        if names_a_secret(name) or name.lower().replace("-", "_").endswith(_SECRET_QUERY_NAMES):
            found += [written, unquote_plus(written)]
    if parts.password:
        found.append(parts.password)
    elif parts.username and parts.scheme in ("http", "https") and len(parts.username) >= MIN_URL_USER_LENGTH:
        found.append(parts.username)
    return found


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
        threading.excepthook = _hiding_thread_excepthook(threading.excepthook)


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
    """*hook* (``sys.excepthook``), run with streams that hide secrets (the process is ending)."""

    def excepthook(*args: Any) -> Any:
        with hiding_output():
            return hook(*args)

    excepthook.hides_secrets = True  # type: ignore[attr-defined]
    return excepthook


def _hiding_thread_excepthook(hook: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """*hook* (``threading.excepthook``); a traceback that shows a secret is written hidden instead.

    Without swapping the process's streams, which other threads are using.
    """

    def excepthook(args: Any) -> Any:
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        if hidden(text) == text or args.exc_type is SystemExit or sys.stderr is None:
            return hook(args)
        name = args.thread.name if args.thread is not None else threading.get_ident()
        sys.stderr.write(f"Exception in thread {name}:\n{hidden(text)}")
        return None

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
    if not isinstance(sys.stdout, _HidingStream):  # nested: the streams hide already
        sys.stdout = _HidingStream(sys.stdout)
    if not isinstance(sys.stderr, _HidingStream):
        sys.stderr = _HidingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
