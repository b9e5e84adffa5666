"""Every command shown in README.md and docs/ runs, so the pages stay true.

Which commands: the fenced ``bash`` and ``console`` blocks of README.md and docs/**/*.md. In a
``bash`` block every line is a shell command (comments and ``\\`` continuations as in bash);
in a ``console`` block the lines starting with ``$ `` are commands and the lines after one
are its output, whose first line must appear in the real output. ``text`` blocks are not run;
``pycon`` blocks run as doctests beside the page's ``python title="x.py"`` files.

How they run: each block is one test, in its own empty directory, its commands in order
(so a block can train a run, then evaluate it). Commands of one process (``plan``, ``list``,
``eval``, ``export``, ``report``, ``data``, ``new-package``, a ``blocks run`` on one device or a
sweep of such runs) run
in this process through the real CLI entry (``run_captured``); the others are ``python -m blocks`` of this checkout,
and so is every command of a block that changes directory or the environment. ``blocks run``
gets small overrides appended to stay fast (:data:`FAST`, only keys the command does not set
itself).

A ``blocks run`` trains only where training is its point (:func:`trains`): a later command of
the block reads what it wrote, the page shows its output, or it picks a Hydra launcher or
sweeper (which only a run exercises). Any other ``blocks run`` is planned with the same
arguments: the page stays true about the configuration, and the tests of test_train.py,
test_recipes.py and test_distributed.py train those compositions.

Markers: an HTML comment on the line right before the fence (invisible on the site):

- ``<!-- doc-test: skip REASON -->``: not run; reported as skipped with REASON (it needs a GPU,
  S3, several machines or a scheduler, or it installs the project).
- ``<!-- doc-test: exit=N -->``: every command of the block must exit with status N (default 0).

A block with a command other than ``blocks``, ``export``, ``cd``, ``mkdir`` or a variable
assignment must be marked ``skip``; the test fails and says so otherwise.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(900)

FAST = {"trainer.max_steps": "3", "trainer.max_epochs": "null"}
SMALLER = {"hydra.sweeper.n_trials": "2"}
"""Keys whose value only makes a command longer: an Optuna search shows its sweeper in two trials.

Replaced where the command sets them; appended where it picks a sweeper that has them
(:data:`SMALLER_SWEEPERS`) and leaves them at the sweeper's default (the preset's 20 trials)."""
SMALLER_SWEEPERS = ("hparams_search=optuna", "hydra/sweeper=optuna")
"""The choices that bring in the keys of :data:`SMALLER` (any other sweeper refuses them)."""
INFO_FLAGS = {"--info", "-i", "--help", "-h", "--cfg", "-c", "--hydra-help", "--shell-completion", "-sc"}
"""Hydra flags that print and exit: nothing trains, and ``--info`` would take an override as its argument."""
SHELL_BUILTINS = ("export ", "cd ", "mkdir ")
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)
_MARKER = re.compile(r"<!--\s*doc-test:\s*(?P<what>skip|exit=\d+)\s*(?P<reason>.*?)\s*-->")
_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


@dataclass
class DocBlock:
    """One fenced block of commands in a page."""

    page: str
    line: int
    lang: str
    commands: list[str]
    expected_output: list[str | None]
    skip: str | None
    exit_code: int

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _logical_lines(body: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line.strip() for line in joined.splitlines()]


def parse(page: Path) -> list[DocBlock]:
    """The command blocks of *page*."""
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        lang = match["lang"]
        if lang not in ("bash", "console"):
            continue
        start = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip().splitlines()
        marker = _MARKER.search(before[-1]) if before else None
        indent = match["indent"]
        body = "\n".join(
            line[len(indent) :] if line.startswith(indent) else line for line in match["body"].splitlines()
        )
        commands: list[str] = []
        outputs: list[str | None] = []
        if lang == "bash":
            commands = [c for c in _logical_lines(body) if c and not c.startswith("#")]
            outputs = [None] * len(commands)
        else:
            for line in _logical_lines(body):
                if line.startswith("$ "):
                    commands.append(line[2:])
                    outputs.append(None)
                elif commands and outputs[-1] is None and line and line != "...":
                    outputs[-1] = line
        if not commands:
            continue
        skip = exit_code = None
        if marker and marker["what"] == "skip":
            skip = marker["reason"] or "marked skip"
        elif marker:
            exit_code = int(marker["what"].split("=")[1])
        rel = str(page.relative_to(REPO))
        found.append(DocBlock(rel, start, lang, commands, outputs, skip, exit_code or 0))
    return found


def fast_tokens(tokens: list[str], *, append: bool = True, plan: bool = False) -> list[str]:
    """A ``blocks`` command line with (*append*) FAST and SMALLER overrides for ``blocks run``.

    With *plan*, a ``blocks run`` becomes ``blocks plan`` with the same arguments.
    """
    tokens = list(tokens)
    if plan and tokens[1:2] == ["run"]:
        tokens[1] = "plan"
    if append and len(tokens) > 1 and tokens[1] == "run" and not INFO_FLAGS & set(tokens):
        keys = {t.split("=", 1)[0] for t in tokens}
        tokens += [f"{k}={v}" for k, v in FAST.items() if k not in keys]
        tokens = [f"{k}={SMALLER[k]}" if (k := t.split("=", 1)[0]) in SMALLER else t for t in tokens]
        if any(t.startswith(SMALLER_SWEEPERS) for t in tokens):
            tokens += [f"{k}={v}" for k, v in SMALLER.items() if k not in keys]
    return tokens


def fast(command: str, *, append: bool = True, plan: bool = False) -> str:
    """*command* as :func:`fast_tokens` makes it, with ``blocks`` → ``python -m blocks``, for bash."""
    tokens = shlex.split(command, comments=True)
    if not tokens or tokens[0] != "blocks":
        return command
    tokens = fast_tokens(tokens, append=append, plan=plan)
    quoted = [t if t.startswith("$") else shlex.quote(t) for t in tokens[1:]]
    return " ".join(['"$BLOCKS_PYTHON" -m blocks', *quoted])


BLOCKS = [block for page in pages() for block in parse(page)]
RUN_PLUGINS = ("hydra/launcher=", "hparams_search=", "hydra/sweeper=")
"""Choices that only a real run exercises: planning does not start a launcher or a sweeper."""
IN_PROCESS = ("plan", "list", "eval", "export", "report", "data", "new-package")
"""Commands that run in the test's own process (the same entry as the console script): one process each
(``data prepare --workers N`` starts its pool of processes from there)."""


def in_process(tokens: list[str]) -> bool:
    """Whether a command runs in the test's process: one of :data:`IN_PROCESS`, or a ``blocks run`` of one process.

    A run on more devices, nodes or another launcher (Ray, a Hydra launcher plugin) is a
    process of its own: its workers print to their own output, which the page may show. A
    sweep under Hydra's basic launcher (any sweeper: grid, Optuna) runs its jobs one after
    another in the process that started it, so a sweep of one-device jobs is one process too.
    """
    if tokens[1] in IN_PROCESS:
        return True
    if tokens[1] != "run":
        return False
    values = dict(t.split("=", 1) for t in tokens[2:] if "=" in t)
    spread = ("trainer.launcher", "hydra/launcher", "trainer.nodes")
    return values.get("trainer.devices", "1") == "1" and not any(key in values for key in spread)


def _written_dirs(tokens: list[str]) -> list[str]:
    return [t.split("=", 1)[1] for t in tokens if t.startswith(("hydra.run.dir=", "hydra.sweep.dir="))]


def trains(block: DocBlock, index: int) -> bool:
    """Whether command *index* of *block* (a ``blocks run``) must really train.

    It must where the block's point is its training: a later command reads its run dir (eval,
    export, report, ``init_from``, a rerun of a pipeline), the page shows what it printed, it is
    expected to fail, or it picks a launcher or sweeper. Otherwise planning shows the same thing
    about the page: the command line composes and checks.
    """
    tokens = shlex.split(block.commands[index], comments=True)
    if block.exit_code != 0 or block.expected_output[index] is not None or INFO_FLAGS & set(tokens):
        return True
    if any(t.startswith(RUN_PLUGINS) for t in tokens):
        return True
    later = " ".join(block.commands[index + 1 :])
    return any(d in later for d in _written_dirs(tokens))


def _params() -> list:
    params = []
    for block in BLOCKS:
        marks = [pytest.mark.slow]  # each command is a process; together they take minutes
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


_PYCON = re.compile(r"^```pycon\n(?P<body>.*?)^```", re.M | re.S)
_TITLED_PYTHON = re.compile(r'^```python title="(?P<file>[\w]+\.py)"\n(?P<body>.*?)^```', re.M | re.S)


@pytest.mark.parametrize("page", [p for p in pages() if "```pycon" in p.read_text()], ids=lambda p: p.name)
def test_pycon_blocks_print_what_the_page_shows(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ``pycon`` block of a page runs as a doctest, beside the page's titled Python files.

    Their blocks register into a throwaway registry: the process's own stays as it was.
    """
    import doctest

    from blocks.spec.registry import Registry

    text = page.read_text()
    modules = []
    for match in _TITLED_PYTHON.finditer(text):
        (tmp_path / match["file"]).write_text(match["body"])
        modules.append(match["file"].removesuffix(".py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    try:
        with Registry.builtin().collecting():
            for match in _PYCON.finditer(text):
                line = text.count("\n", 0, match.start()) + 2
                test = parser.get_doctest(match["body"], {}, f"{page.name}:{line}", str(page), line)
                runner.run(test, out=print)
    finally:
        for module in modules:
            sys.modules.pop(module, None)
    assert runner.summarize(verbose=False).failed == 0, "a pycon block printed otherwise (above)"


def test_the_pages_have_commands() -> None:
    assert len(BLOCKS) > 20
    assert any("blocks eval" in c for b in BLOCKS for c in b.commands)


def test_a_run_trains_only_where_the_block_needs_its_training() -> None:
    commands = [
        "blocks run recipe=blobs hydra.run.dir=runs/a",
        "blocks eval runs/a",
        "blocks run recipe=blobs optim.lr=0.1",
        "blocks run -m hparams_search=optuna recipe=blobs",
        "blocks run -m recipe=blobs optim.lr=1,2 hydra.sweep.dir=sweeps/b",
        "blocks report sweeps/b",
    ]
    block = DocBlock("page.md", 1, "bash", commands, [None] * len(commands), None, 0)
    assert [trains(block, i) for i in (0, 2, 3, 4)] == [True, False, True, True]
    shown = DocBlock("page.md", 1, "console", commands[2:3], ["run dir: ..."], None, 0)
    failing = DocBlock("page.md", 1, "bash", commands[2:3], [None], None, 2)
    assert trains(shown, 0) and trains(failing, 0)
    assert fast(commands[2], plan=True).startswith('"$BLOCKS_PYTHON" -m blocks plan recipe=blobs')
    assert " hydra.sweeper.n_trials=2 " in fast(commands[3] + " hydra.sweeper.n_trials=20")
    assert fast(commands[3]).endswith(" hydra.sweeper.n_trials=2")  # the preset's 20 trials otherwise
    assert "n_trials" not in fast(commands[4]), "the basic sweeper has no n_trials"


@pytest.mark.parametrize("block", _params())
def test_doc_commands_run(block: DocBlock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    for command in block.commands:
        ok = command.startswith("blocks ") or command.startswith(SHELL_BUILTINS) or _ASSIGNMENT.match(command)
        assert ok, (
            f"{block.id}: '{command}' is not a blocks command; mark the block with "
            "<!-- doc-test: skip REASON --> if it cannot run here"
        )
    env = {**os.environ, "BLOCKS_PYTHON": sys.executable, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    env["PYTHONUNBUFFERED"] = "1"
    if any(c.startswith(SHELL_BUILTINS) for c in block.commands):
        outputs = _run_in_bash(block, tmp_path, env)
    else:
        monkeypatch.chdir(tmp_path)
        outputs = _run_each(block, tmp_path, env)
    for index, expected in enumerate(block.expected_output):
        if expected is None:
            continue
        assert _normalized(expected) in _normalized(outputs[index]), (
            f"{block.id}: '{block.commands[index]}' did not print: {expected}"
        )


def _check_exit(block: DocBlock, index: int, code: int, output: str) -> None:
    assert code == block.exit_code, (
        f"{block.id}: '{block.commands[index]}' exited {code}, not {block.exit_code}:\n{output[-6000:]}"
    )


def _run_each(block: DocBlock, tmp_path: Path, env: dict[str, str]) -> list[str]:
    """The block's commands one by one: assignments kept, one-process commands in this process, the rest as processes."""
    from blocks.cli.main import run_captured

    variables: dict[str, str] = {}
    outputs: list[str] = []
    for index, command in enumerate(block.commands):
        for name, value in variables.items():
            command = command.replace("${" + name + "}", value).replace("$" + name, value)
        if _ASSIGNMENT.match(command):
            name, value = shlex.split(command, comments=True)[0].split("=", 1)
            variables[name] = value
            outputs.append("")
            continue
        tokens = shlex.split(command, comments=True)
        if tokens[1] == "run" and not trains(block, index):
            tokens[1] = "plan"
        if in_process(tokens):
            code, output = run_captured(fast_tokens(tokens, append=block.exit_code == 0)[1:])
        else:
            script = fast(shlex.join(tokens), append=block.exit_code == 0)
            proc = subprocess.run(
                ["bash", "-c", script + " 2>&1"],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=850,
            )
            code, output = proc.returncode, proc.stdout
        _check_exit(block, index, code, output)
        outputs.append(output)
    return outputs


def _run_in_bash(block: DocBlock, tmp_path: Path, env: dict[str, str]) -> list[str]:
    """A block that changes directory or the environment: one bash script, every command a process."""
    script: list[str] = []
    for index, command in enumerate(block.commands):
        # A command shown failing trains nothing, and its output names its own overrides.
        plan = command.startswith("blocks run") and not trains(block, index)
        script.append(fast(command, append=block.exit_code == 0, plan=plan) + f" > out_{index}.txt 2>&1")
        script.append(
            f'rc=$?; [ $rc -eq {block.exit_code} ] || {{ echo "exit $rc: {index}"; cat out_{index}.txt; exit 1; }}'
        )
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=850
    )
    assert proc.returncode == 0, (
        f"{block.id}: a command did not exit {block.exit_code}:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
    )
    outputs = []
    for index in range(len(block.commands)):
        out = tmp_path / f"out_{index}.txt"
        outputs.append(out.read_text() if out.exists() else "")
    return outputs


def _normalized(text: str) -> str:
    """Text without box-drawing characters and with single spaces (tables are as wide as the terminal)."""
    return " ".join(re.sub("[\u2500-\u257f]", " ", text).split())
