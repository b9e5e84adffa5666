"""Block packages found in this process: fake-installed ones (a dist-info on ``sys.path``), no pip.

tests/test_packages.py installs real wheels into a venv; these tests cover what discovery and
planning do with packages, in process, through the ``fake_site`` fixture.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from blocks.model import MLP
from blocks.spec.errors import RegistryError
from blocks.spec.registry import Registry
from tests.catalog_fixtures import FakeSite

NET = '''
from dataclasses import dataclass

from blocks import register
from blocks.model import MLP

BLOCKS_API = 1


@register("net")
@dataclass(frozen=True, kw_only=True)
class Net(MLP):
    """The {team} team's net."""


@register("only_{team}")
@dataclass(frozen=True, kw_only=True)
class Only(MLP):
    """Only the {team} team has it."""
'''


def _share_acme(site: FakeSite) -> None:
    """Two distributions whose modules live in one implicit namespace package, ``acme``."""
    for team, version in [("vision", "1.0.0"), ("tabular", "2.0.0")]:
        site.install(
            f"acme-{team}-ns",
            version,
            {team: f"acme.{team}"},
            {f"acme/{team}/__init__.py": NET.format(team=team)},
        )


def test_packages_sharing_a_namespace_package_keep_their_own_blocks(
    fake_site: FakeSite, cli_in_process
) -> None:
    _share_acme(fake_site)
    result = cli_in_process("list", "model", "--json")
    assert result.returncode == 0, result.output
    listed = {e["name"]: e["package"] for e in json.loads(result.output[result.output.index("[") :])}
    assert listed["vision/net"] == "acme-vision-ns" and listed["vision/only_vision"] == "acme-vision-ns"
    assert listed["tabular/net"] == "acme-tabular-ns" and listed["tabular/only_tabular"] == "acme-tabular-ns"
    warnings = [line for line in result.output.splitlines() if line.startswith("warning")]
    assert "vision/only_tabular" not in listed and not [w for w in warnings if "acme" in w], warnings
    plan = cli_in_process("plan", "recipe=blobs", "model=tabular/only_tabular")
    assert plan.returncode == 0, plan.output


RAISES = '''
from dataclasses import dataclass

from blocks import register
from blocks.model import MLP
from blocks.optim import AdamW
from blocks.strategy import Single

BLOCKS_API = 1


@register("badcheck")
@dataclass(frozen=True, kw_only=True)
class BadCheck(MLP):
    """A model whose check raises."""

    def check(self, ctx):
        raise ZeroDivisionError("boom in check")


@register("badparams")
@dataclass(frozen=True, kw_only=True)
class BadParams(MLP):
    """A model whose parameter count raises."""

    def num_parameters(self, spec):
        return {}["nope"]


@register("badoptim")
@dataclass(frozen=True, kw_only=True)
class BadOptim(AdamW):
    """An optimizer whose check raises."""

    def check(self, ctx):
        raise RuntimeError("boom in optim")


@register("badmesh")
@dataclass(frozen=True, kw_only=True)
class BadMesh(Single):
    """A strategy whose mesh raises: the plan has no batch arithmetic to check."""

    def mesh(self, world_size):
        raise RuntimeError("boom in mesh")


@register("viasuper")
@dataclass(frozen=True, kw_only=True)
class ViaSuper(MLP):
    """A model whose own check is fine; blocks' MLP.check, reached through super(), raises on its dropout."""

    dropout: str = "none"

    def check(self, ctx):
        super().check(ctx)


@register("refuses")
@dataclass(frozen=True, kw_only=True)
class Refuses(MLP):
    """A model whose check refuses a value on purpose."""

    def check(self, ctx):
        from blocks.spec.errors import ConfigError, Problem

        raise ConfigError(Problem("model.hidden", "hidden must be even for refuses", "model.hidden=[8]"))
'''


def test_a_package_owns_the_modules_beside_its_entry_point_when_another_imports_them_first(
    fake_site: FakeSite, cli_in_process
) -> None:
    """Regression: with its entry point a submodule (``alpha_pkg.plugin``), the package's block in
    ``alpha_pkg.models`` went to the namespace of another package that imported it first."""
    block = NET.format(team="alpha").replace("BLOCKS_API = 1\n", "")
    fake_site.install(
        "alpha-blocks",
        "1.0.0",
        {"alpha": "alpha_pkg.plugin"},
        {
            "alpha_pkg/__init__.py": "",
            "alpha_pkg/models.py": block,
            "alpha_pkg/plugin.py": "from alpha_pkg import models\n\nBLOCKS_API = 1\n",
        },
    )
    fake_site.install(
        "aaa-blocks",
        "2.0.0",
        {"aaa": "aaa_pkg"},
        {"aaa_pkg/__init__.py": "import alpha_pkg.models\n\nBLOCKS_API = 1\n"},
    )
    result = cli_in_process("list", "model", "--json")
    assert result.returncode == 0, result.output
    listed = {e["name"]: e["package"] for e in json.loads(result.output[result.output.index("[") :])}
    assert listed.get("alpha/net") == "alpha-blocks" and "aaa/net" not in listed, listed


@pytest.mark.parametrize(
    ("block", "raised"),
    [
        ("badcheck", "ZeroDivisionError: boom in check in check()"),
        ("badparams", "KeyError: 'nope' in num_parameters()"),
    ],
)
def test_a_package_block_that_raises_while_planning_is_named(
    fake_site: FakeSite, cli_in_process, block: str, raised: str
) -> None:
    fake_site.install(
        "weird-blocks", "0.1.0", {"weird": "weird_blocks"}, {"weird_blocks/__init__.py": RAISES}
    )
    result = cli_in_process("plan", "recipe=blobs", f"model=weird/{block}")
    assert result.returncode == 2, result.output
    text = " ".join(result.output.split()).replace("│", "")
    text = " ".join(text.split())
    assert f"error model: model block 'weird/{block}' (from weird-blocks 0.1.0) raised {raised}" in text, text
    assert "weird_blocks/__init__.py:" in text and "report it to the maintainers of weird-blocks" in text
    assert "Traceback" not in result.output


def test_every_block_that_raises_while_planning_is_named_and_the_other_checks_still_run(
    fake_site: FakeSite, cli_in_process
) -> None:
    """Regression: the first block that raised ended the plan; the next one, and the batch
    arithmetic, showed only after the user had fixed it."""
    fake_site.install(
        "weird-blocks", "0.1.0", {"weird": "weird_blocks"}, {"weird_blocks/__init__.py": RAISES}
    )
    both = ["model=weird/badcheck", "optim=weird/badoptim", "data.batch_size=100000"]
    result = cli_in_process("plan", "recipe=blobs", *both)
    assert result.returncode == 2, result.output
    text = " ".join(result.output.replace("│", "").split())
    assert "model block 'weird/badcheck' (from weird-blocks 0.1.0) raised ZeroDivisionError" in text, text
    assert "optim block 'weird/badoptim' (from weird-blocks 0.1.0) raised RuntimeError: boom in optim" in text
    assert "error data.batch_size: the training split has" in text, "the checks after them ran"
    planned = cli_in_process("plan", "--json", "recipe=blobs", *both)
    checks = [p["check"] for p in json.loads(planned.stdout)["problems"]]
    assert checks.count("block-raised") == 2 and "global-batch-fits-data" in checks, checks
    # The numbers the batch arithmetic reads are not derived: it is skipped, the other block still checked.
    planned = cli_in_process("plan", "--json", "recipe=blobs", *both, "strategy=weird/badmesh")
    problems = json.loads(planned.stdout)["problems"]
    raised = sorted(p["key"] for p in problems if p["check"] == "block-raised")
    assert raised == ["model", "optim", "strategy"] and len(problems) == 3, problems


def test_a_raise_in_blocks_own_code_a_package_block_reached_through_super_is_blocks_bug(
    fake_site: FakeSite, cli_in_process
) -> None:
    """Regression: blocks' MLP.check, raising under a package's block, was the package's to fix."""
    fake_site.install(
        "weird-blocks", "0.1.0", {"weird": "weird_blocks"}, {"weird_blocks/__init__.py": RAISES}
    )
    result = cli_in_process("plan", "recipe=blobs", "model=weird/viasuper")
    assert result.returncode == 2, result.output
    text = " ".join(result.output.replace("│", "").split())
    assert "model block 'weird/viasuper' (from weird-blocks 0.1.0) raised TypeError" in text, text
    assert (
        "in blocks' own MLP.check()" in text and "this is a bug in blocks or a value of this block" in text
    ), text
    assert "report it to blocks and to the maintainers of weird-blocks" in text, text


def test_an_error_a_block_raises_on_purpose_keeps_its_key_and_fix(
    fake_site: FakeSite, cli_in_process
) -> None:
    """Regression: a ``BlocksError`` a block's check raised on purpose was reported as the package's bug."""
    fake_site.install(
        "weird-blocks", "0.1.0", {"weird": "weird_blocks"}, {"weird_blocks/__init__.py": RAISES}
    )
    result = cli_in_process("plan", "recipe=blobs", "model=weird/refuses")
    assert result.returncode == 2, result.output
    text = " ".join(result.output.split())
    assert (
        "error model.hidden: hidden must be even for refuses" in text and "fix: model.hidden=[8]" in text
    ), text
    assert "block-raised" not in text and "maintainers" not in text
    # Regression: the refusal ended the plan, and the other block's problem, found first, was lost.
    result = cli_in_process("plan", "--json", "recipe=blobs", "model=weird/refuses", "optim=weird/badoptim")
    assert result.returncode == 2, result.output
    problems = {(p["key"], p["check"]) for p in json.loads(result.stdout)["problems"]}
    assert {("model.hidden", ""), ("optim", "block-raised")} <= problems, problems


def test_a_project_block_that_raises_while_planning_is_the_projects_to_fix(
    fake_site: FakeSite, cli_in_process, tmp_path: Path
) -> None:
    """Regression: it was reported as "a bug in blocks"."""
    broken = "\n    def check(self, ctx):\n        raise RuntimeError('mine broke')\n"
    _project(tmp_path, {"mine.py": ("mine", "Mine", broken)})
    result = cli_in_process("plan", "recipe=blobs", "model=mine")
    assert result.returncode == 2, result.output
    text = " ".join(result.output.split())
    assert "raised RuntimeError: mine broke" in text and "mine.py:" in text, text
    assert "bug in blocks" not in text and "fix blocks_project.mine:Mine" in text


PRESETS = NET.format(team="vision")


def test_a_package_preset_may_name_a_built_in_block(fake_site: FakeSite, cli_in_process) -> None:
    fake_site.install(
        "acme-vision",
        "0.1.0",
        {"acme_vision": "acme_vision"},
        {
            "acme_vision/__init__.py": PRESETS,
            "acme_vision/conf/model/bigmlp.yaml": "_block_: mlp\nhidden: [16]\n",
            "acme_vision/conf/model/mynet.yaml": "_block_: net\nhidden: [24]\n",
            "acme_vision/conf/model/lost.yaml": "_block_: nosuch\n",
        },
    )
    built_in = cli_in_process("plan", "--json", "recipe=blobs", "model=acme_vision/bigmlp")
    assert built_in.returncode == 0, built_in.output
    plan = json.loads(built_in.output[built_in.output.index("{") :])
    assert plan["blocks"]["model"]["block"] == "mlp", plan["blocks"]["model"]
    own = cli_in_process("plan", "--json", "recipe=blobs", "model=acme_vision/mynet")
    assert json.loads(own.output[own.output.index("{") :])["blocks"]["model"]["block"] == "acme_vision/net"
    warnings = " ".join(built_in.output.split())
    assert (
        "warning model: " in warnings and "lost.yaml raised RegistryError: no model block named" in warnings
    )
    assert "bigmlp.yaml raised" not in warnings


def test_a_mistyped_package_option_is_offered_the_package_options(
    fake_site: FakeSite, cli_in_process
) -> None:
    fake_site.install(
        "acme-vision",
        "0.1.0",
        {"acme_vision": "acme_vision"},
        {
            "acme_vision/__init__.py": PRESETS,
            "acme_vision/conf/model/wide.yaml": "_block_: net\nhidden: [64]\n",
        },
    )
    result = cli_in_process("plan", "recipe=blobs", "model=acme_vision/wid")
    assert result.returncode == 2, result.output
    text = " ".join(result.output.split())
    assert "no option 'acme_vision/wid' in group 'model'; did you mean 'acme_vision/wide'" in text, text
    available = text.split("available: ")[1]
    assert "acme_vision/net" in available and "acme_vision/wide" in available and "mlp" in available


UNCONFIGURABLE = """
from dataclasses import dataclass
from typing import Literal

from blocks import register
from blocks.model import MLP

BLOCKS_API = 1


@register("withset")
@dataclass(frozen=True, kw_only=True)
class WithSet(MLP):
    \"\"\"A model with a field no config can hold.\"\"\"

    ids: frozenset = frozenset({1, 2})


@register("withliteral")
@dataclass(frozen=True, kw_only=True)
class WithLiteral(MLP):
    \"\"\"Another.\"\"\"

    mode: Literal["a", "b"] = "a"


@register("withpair")
@dataclass(frozen=True, kw_only=True)
class WithPair(MLP):
    \"\"\"And another.\"\"\"

    pair: tuple[int, str] = (1, "a")


@register("fine")
@dataclass(frozen=True, kw_only=True)
class Fine(MLP):
    \"\"\"Its other blocks still work.\"\"\"
"""


def test_a_package_block_with_a_field_no_config_holds_is_left_out_at_registration(
    fake_site: FakeSite, cli_in_process
) -> None:
    fake_site.install(
        "weird-blocks", "0.1.0", {"weird": "weird_blocks"}, {"weird_blocks/__init__.py": UNCONFIGURABLE}
    )
    listed = cli_in_process("list", "model", "--json")
    assert listed.returncode == 0, listed.output
    names = {e["name"] for e in json.loads(listed.output[listed.output.index("[\n") :])}
    assert "weird/fine" in names and "mlp" in names
    assert not names & {"weird/withset", "weird/withliteral", "weird/withpair"}, names
    warned = " ".join(listed.output.split())
    for block, field, annotation in [
        ("withset", "ids", "frozenset"),
        ("withliteral", "mode", "Literal['a', 'b']"),
        ("withpair", "pair", "tuple[int, str]"),
    ]:
        assert f"package weird-blocks 0.1.0: model block 'weird/{block}' (weird_blocks:With" in warned, warned
        assert f"has field '{field}' of type {annotation}, which no config can hold" in warned, warned
    assert "a block field must be one of: bool, int, float, str" in warned
    assert cli_in_process("list").returncode == 0
    chosen = cli_in_process("plan", "recipe=blobs", "model=weird/withset")
    assert chosen.returncode == 2, chosen.output
    text = " ".join(chosen.output.split())
    assert "error package weird: package weird-blocks 0.1.0: model block 'weird/withset'" in text, text
    assert "report it to the maintainers of weird-blocks" in text and "Traceback" not in text
    assert cli_in_process("plan", "recipe=blobs", "model=weird/fine").returncode == 0
    assert cli_in_process("plan", "recipe=blobs").returncode == 0, "the rest of the catalog still works"


PROJECT_BLOCK = '''
from dataclasses import dataclass

from blocks import register
from blocks.model import MLP


@register("{name}")
@dataclass(frozen=True, kw_only=True)
class {cls}(MLP):
    """A project's model."""
{extra}
'''


def _project(root: Path, files: dict[str, tuple[str, str, str]]) -> None:
    """A project in *root*: ``[tool.blocks] recipes`` and one block per file (name, class, extra field)."""
    (root / "pyproject.toml").write_text('[tool.blocks]\nrecipes = ["recipes/"]\n')
    (root / "recipes").mkdir()
    for file, (name, cls, extra) in files.items():
        (root / "recipes" / file).write_text(PROJECT_BLOCK.format(name=name, cls=cls, extra=extra))


def test_project_blocks_are_the_projects_and_may_not_take_a_package_namespace(
    fake_site: FakeSite, cli_in_process, tmp_path: Path
) -> None:
    fake_site.install(
        "acme-vision", "0.1.0", {"acme_vision": "acme_vision"}, {"acme_vision/__init__.py": PRESETS}
    )
    _project(
        tmp_path,
        {
            "mine.py": ("tiny", "Tiny", ""),
            "squat.py": ("acme_vision/x", "Squat", ""),
            "loose.py": ("loose/y", "Loose", ""),
        },
    )
    result = cli_in_process("list", "model", "--json")
    assert result.returncode == 0, result.output
    listed = {e["name"]: e["package"] for e in json.loads(result.output[result.output.index("[\n") :])}
    assert listed["tiny"] == "project" and listed["mlp"] == "blocks", listed
    assert (
        listed["acme_vision/net"] == "acme-vision"
        and "acme_vision/x" not in listed
        and "loose/y" not in listed
    )
    text = " ".join(result.output.split())
    squat, loose = tmp_path / "recipes" / "squat.py", tmp_path / "recipes" / "loose.py"
    assert (
        f"model block 'acme_vision/x' (blocks_project.squat.Squat in {squat}) is registered under 'acme_vision/', "
        "the namespace of the installed package acme-vision, but outside a block package" in text
    ), text
    assert (
        f"model block 'loose/y' (blocks_project.loose.Loose in {loose}) is registered under 'loose/' but"
        in text
    )
    assert 'register it under a plain name, e.g. @register("acme_vision_x")' in text and "loose.py:8" in text
    assert cli_in_process("plan", "recipe=blobs", "model=tiny").returncode == 0


def test_a_project_block_with_a_field_no_config_holds_names_its_file(
    fake_site: FakeSite, cli_in_process, tmp_path: Path
) -> None:
    _project(tmp_path, {"odd.py": ("odd", "Odd", "\n    ids: frozenset = frozenset({1})\n")})
    result = cli_in_process("list", "model", "--json")
    assert result.returncode == 0, result.output
    text = " ".join(result.output.split())
    odd = tmp_path / "recipes" / "odd.py"
    assert f"model block 'odd' (blocks_project.odd.Odd in {odd}) has field 'ids' of type frozenset" in text, (
        text
    )
    assert (
        "which no config can hold" in text
        and "a block field must be one of: bool" in text
        and "odd.py:8" in text
    )
    assert '"name": "odd"' not in result.output


def test_a_built_in_block_with_a_field_no_config_holds_is_refused_at_registration() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Pair(MLP):
        pair: tuple[int, str] = (1, "a")

    with pytest.raises(RegistryError) as raised:
        Registry().add(Pair, "pair")
    message = str(raised.value)
    assert message.startswith(f"model.pair: model block 'pair' ({__name__}.") and __file__ in message
    assert "has field 'pair' of type tuple[int, str], which no config can hold (ValidationError" in message


def test_a_package_that_exits_while_importing_is_named_and_the_other_runs_go_on(
    fake_site: FakeSite, cli_in_process
) -> None:
    """Regression: a package calling ``sys.exit()`` at import ended every ``blocks`` command, saying
    only its own message, with no package named."""
    fake_site.install(
        "exiting-blocks",
        "0.1.0",
        {"exits": "exiting_blocks"},
        {"exiting_blocks/__init__.py": "import sys\nsys.exit('exiting cannot start')\n"},
    )
    result = cli_in_process("plan", "recipe=blobs")
    assert result.returncode == 0, result.output
    text = " ".join(result.output.split())
    assert "exiting-blocks 0.1.0 (entry point 'exits' = exiting_blocks) failed to import" in text, text


def test_a_lone_module_package_takes_no_conf_dir_beside_it(fake_site: FakeSite, cli_in_process) -> None:
    """Regression: a package that is a single module took any ``conf/`` in site-packages (another
    distribution's, badly packaged) as its presets."""
    fake_site.install(
        "single-blocks",
        "0.1.0",
        {"single": "single_blocks"},
        {"single_blocks.py": "BLOCKS_API = 1\n", "conf/model/foreign.yaml": "_block_: mlp\n"},
    )
    result = cli_in_process("list")  # the options of each group, presets included
    assert result.returncode == 0, result.output
    assert "single/foreign" not in result.output


def test_an_api_version_written_as_a_string_is_named_as_one(fake_site: FakeSite, cli_in_process) -> None:
    """Regression: ``BLOCKS_API = "1"`` was refused saying it targets block API 1, which this blocks implements."""
    fake_site.install(
        "quoted-blocks",
        "0.1.0",
        {"quoted": "quoted_blocks"},
        {"quoted_blocks/__init__.py": 'BLOCKS_API = "1"\n'},
    )
    result = cli_in_process("plan", "recipe=blobs")
    text = " ".join(result.output.split())
    assert "targets block API '1', but this blocks implements block API 1" in text, text
    assert "must set BLOCKS_API = 1, an int" in text, text


UNFINISHED = '''
from dataclasses import dataclass

from blocks import register
from blocks.model import ModelBlock

BLOCKS_API = 1


@register("unfinished")
@dataclass(frozen=True, kw_only=True)
class Unfinished(ModelBlock):
    """A model block without num_parameters."""

    def build(self, spec):
        """A network."""
        from torch import nn

        return nn.Linear(spec.num_features, spec.num_classes)
'''


def test_a_block_missing_a_required_method_is_told_to_define_it_not_blamed_on_blocks(
    fake_site: FakeSite, cli_in_process
) -> None:
    """Regression: the base class's ``NotImplementedError`` was reported as "a bug in blocks"."""
    fake_site.install(
        "unfinished-blocks",
        "0.1.0",
        {"todo": "unfinished_blocks"},
        {"unfinished_blocks/__init__.py": UNFINISHED},
    )
    result = cli_in_process("plan", "recipe=blobs", "model=todo/unfinished")
    assert result.returncode == 2, result.output
    text = " ".join(result.output.replace("│", "").split())
    assert "does not define num_parameters(), which every model block must" in text, text
    assert "define num_parameters() in unfinished_blocks:Unfinished" in text, text
    assert "bug in blocks" not in text


ACME = '''
from dataclasses import dataclass

from blocks import register
from blocks.model import MLP

BLOCKS_API = 1


@register("tiny")
@dataclass(frozen=True, kw_only=True)
class Tiny(MLP):
    """An MLP."""
'''


def test_blocks_of_a_package_whose_namespace_collided_are_not_registered_under_an_importers(
    fake_site: FakeSite, cli_in_process
) -> None:
    """Regression: two packages claiming 'acme' were both refused, but a third package importing one of
    them registered its blocks in its own namespace, attributed to itself (and a project recipe
    importing it, as built-in blocks of blocks)."""
    fake_site.install("acme-one", "0.1.0", {"acme": "acme_one"}, {"acme_one/__init__.py": ACME})
    fake_site.install("acme-two", "0.1.0", {"acme": "acme_two"}, {"acme_two/__init__.py": "BLOCKS_API = 1\n"})
    fake_site.install(
        "cross-blocks",
        "0.1.0",
        {"crs": "cross_blocks"},
        {"cross_blocks/__init__.py": "import acme_one\nBLOCKS_API = 1\n"},
    )
    result = cli_in_process("list", "model", "--json")
    assert result.returncode == 0, result.output
    names = {e["name"] for e in json.loads(result.output[result.output.index("\n[") + 1 :])}
    assert not {"crs/tiny", "acme/tiny", "tiny"} & names, names
    planned = cli_in_process("plan", "recipe=blobs")
    text = " ".join(planned.output.split())
    assert "both claim the block namespace 'acme'" in text, text
    assert "cross-blocks 0.1.0 (entry point 'crs' = cross_blocks) failed to import" in text, text
    assert (
        "acme_one is part of package acme-one 0.1.0, whose block namespace 'acme' was not loaded" in text
    ), text
