"""``blocks new-package NAME``: a pip-installable block package that passes its own conformance test."""

from __future__ import annotations

import importlib.util
import keyword
import re
import sys
from pathlib import Path
from string import Template

from blocks.core.packages import API_VERSION
from blocks.spec.errors import BlocksError, Problem

_DIST = re.compile(r"^[A-Za-z][A-Za-z0-9._-]*$")
_NAMESPACE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")

PYPROJECT = """\
[build-system]
requires = ["hatchling>=1.24"]
build-backend = "hatchling.build"

[project]
name = "$dist"
version = "0.1.0"
description = "Blocks of the $namespace team."
requires-python = ">=3.10"
dependencies = ["blocks"]

[project.optional-dependencies]
test = ["pytest>=8"]

# blocks imports $module inside the namespace '$namespace': its blocks are model=$namespace/...
[project.entry-points."blocks"]
$namespace = "$module"

[tool.hatch.build.targets.wheel]
packages = ["src/$module"]

[tool.pytest.ini_options]
# blocks' conformance kit trains in pytest's own process (no interpreter start per run)
blocks_kit_in_process = true

[tool.ruff]
line-length = 110
"""

README = """\
# $dist

Blocks shared as a package (made with `blocks new-package`).

```bash
pip install .                              # or pip install -e . while developing
blocks list model                          # $namespace/tiny_mlp, from $dist 0.1.0
blocks run recipe=$namespace/demo          # the package's recipe
blocks run recipe=$namespace/demo model=$namespace/wide   # a YAML preset
pytest tests/                              # the conformance kit on the package's blocks
```

Add a block: a frozen dataclass subclassing a kind's base, decorated with `@register("name")`,
imported by `src/$module/__init__.py`. Presets: `src/$module/conf/<group>/<name>.yaml`.
"""

INIT = '''\
"""The $namespace block package: imported by blocks inside the '$namespace' namespace."""

from $module.blocks import TinyMLP
from $module.recipes import demo

BLOCKS_API = $api
"""The block API this package targets; blocks refuses the package when it implements another."""

__all__ = ["BLOCKS_API", "TinyMLP", "demo"]
'''

BLOCKS = '''\
"""The package's blocks: torch-free descriptions; torch is imported only in build()."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from blocks import register
from blocks.data import FeatureBatch
from blocks.model import ModelBlock

if TYPE_CHECKING:
    from blocks.core.plan import CheckContext
    from blocks.data import BatchSpec
    from torch import nn


@register("tiny_mlp")
@dataclass(frozen=True, kw_only=True)
class TinyMLP(ModelBlock):
    """A one-hidden-layer perceptron from feature vectors to class logits.

    Attributes:
        hidden: width of the hidden layer.
    """

    accepts = (FeatureBatch,)

    hidden: int = 32

    def num_parameters(self, spec: BatchSpec) -> int:
        """Weights and biases of both layers (torch-free, for the plan)."""
        assert isinstance(spec, FeatureBatch)
        return (spec.num_features + 1) * self.hidden + (self.hidden + 1) * spec.num_classes

    def build(self, spec: BatchSpec) -> nn.Module:
        """The network for *spec*."""
        from torch import nn

        assert isinstance(spec, FeatureBatch)
        return nn.Sequential(
            nn.Linear(spec.num_features, self.hidden), nn.ReLU(), nn.Linear(self.hidden, spec.num_classes)
        )

    def check(self, ctx: CheckContext) -> None:
        """The hidden width must be positive."""
        super().check(ctx)
        ctx.positive("hidden", self.hidden)
'''

RECIPES = '''\
"""The package's recipes: recipe=$namespace/demo."""

from blocks import Recipe, recipe
from blocks.data import Blobs
from blocks.task import Classification
from blocks.trainer import Trainer

from $module.blocks import TinyMLP


@recipe("demo")
def demo() -> Recipe:
    """TinyMLP on generated blobs; trains in seconds on a CPU."""
    return Recipe(data=Blobs(), model=TinyMLP(), task=Classification(), trainer=Trainer(max_epochs=1))
'''

PRESET = """\
# A preset of the package's block: model=$namespace/wide
_block_: tiny_mlp
hidden: 256
"""

TEST = '''\
"""Conformance: blocks' kit on the package's blocks (the blocks_kit fixture comes with blocks)."""

from blocks.testing import Kit


def test_tiny_mlp_conforms(blocks_kit: Kit) -> None:
    """Round trip, plan, listing, CPU steps with a checkpoint resume, and a 2-process DDP run."""
    blocks_kit.check_block("model", "$namespace/tiny_mlp")
'''

FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": README,
    "src/$module/__init__.py": INIT,
    "src/$module/blocks.py": BLOCKS,
    "src/$module/recipes.py": RECIPES,
    "src/$module/conf/model/wide.yaml": PRESET,
    "tests/test_conformance.py": TEST,
}


def module_name(name: str) -> str:
    """The import name of the package *name* (``acme-vision`` → ``acme_vision``)."""
    return re.sub(r"[-.]+", "_", name).lower()


def _module_problem(module: str) -> str | None:
    """Why *module* cannot be a new package's import name, or None."""
    if not module.isidentifier() or keyword.iskeyword(module):
        return f"its module '{module}' is a Python keyword or not a Python name"
    try:
        spec = importlib.util.find_spec(module)
        taken = spec is not None and spec.origin is not None  # a bare directory (namespace) is no module
    except (ImportError, ValueError):
        taken = True
    if taken or module in sys.builtin_module_names:
        return f"its module '{module}' already exists here (import {module} finds it): installing it would shadow or overwrite that one"
    return None


def refuse_module(name: str, module: str) -> None:
    """Refuse a package *name* whose import name *module* is a keyword or an importable module."""
    why = _module_problem(module)
    if why is None:
        return
    suggestion = next(
        (
            candidate
            for candidate in (
                (f"my-{name}", f"{name}-blocks")
                if name.endswith("blocks")
                else (f"{name}-blocks", f"my-{name}")
            )
            if _module_problem(module_name(candidate)) is None
        ),
        "acme-vision",
    )
    raise BlocksError(
        Problem(
            "NAME", f"'{name}' cannot be a package name: {why}", f"choose another name, e.g. {suggestion}"
        )
    )


def new_package(name: str, directory: Path, namespace: str | None = None) -> list[Path]:
    """Write the package *name* into *directory* (which must not exist); the files written."""
    if not _DIST.match(name):
        raise BlocksError(
            Problem(
                "NAME",
                f"'{name}' is not a package name",
                "use letters, digits, '-', '_' and '.', e.g. acme-vision",
            )
        )
    module = module_name(name)
    namespace = namespace or re.sub(r"_blocks$", "", module)
    if not _NAMESPACE.match(namespace):
        raise BlocksError(
            Problem("--namespace", f"'{namespace}' is not a block namespace", "letters, digits, '_' and '-'")
        )
    if directory.exists() or directory.is_symlink():  # a dangling link too: mkdir would fail on it
        raise BlocksError(
            Problem(
                "--dir",
                f"{directory} already exists; nothing was written",
                "choose a new directory with --dir",
            )
        )
    refuse_module(name, module)
    values = {"dist": name, "module": module, "namespace": namespace, "api": str(API_VERSION)}
    written = []
    for relative, text in FILES.items():
        path = directory / Template(relative).substitute(values)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(text).substitute(values))
        written.append(path)
    return written
