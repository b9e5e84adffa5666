"""A team's own repository: its recipe files and presets next to blocks' own, completion, --help.

The project is a throwaway directory with its own ``pyproject.toml`` ([tool.blocks]), a recipe
file and a preset; the CLI runs as a subprocess in it, as a user would run it there.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from blocks.cli.main import run_captured
from tests.conftest import Result, run_cli, run_in_process

PYPROJECT = """\
[project]
name = "myteam"
version = "0.1"

[tool.blocks]
recipes = ["recipes/"]
conf = ["conf/"]
"""

MINE = '''\
"""My team's recipe file."""

from blocks import Recipe, recipe
from blocks.data import Blobs
from blocks.model import MLP
from blocks.task import Classification
from blocks.trainer import Trainer


@recipe("mine")
def mine() -> Recipe:
    """Our blobs classifier, two steps long."""
    return Recipe(
        data=Blobs(batch_size=16),
        model=MLP(hidden=(8,)),
        task=Classification(),
        trainer=Trainer(max_epochs=None, max_steps=2, val_every=2),
    )


recipe("mine_wide").based_on("mine", model={"hidden": (16,)})
'''

NETS = '''\
"""A network of the team's own, in a helper module of the recipe dir (not a recipe file itself)."""

import torch


class TinyNet(torch.nn.Module):
    """One linear layer."""

    def __init__(self, in_features: int = 2, num_classes: int = 3) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)
'''


def make_project(root: Path) -> Path:
    """A repository with [tool.blocks], recipes/mine.py, recipes/_nets.py and conf/optim/fastsgd.yaml."""
    (root / "recipes").mkdir(parents=True)
    (root / "conf" / "optim").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "recipes" / "mine.py").write_text(MINE)
    (root / "recipes" / "_nets.py").write_text(NETS)
    (root / "conf" / "optim" / "fastsgd.yaml").write_text("_block_: sgd\nlr: 0.05\nmomentum: 0.5\n")
    return root


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("myteam"))


def blocks_in(project: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return run_cli(args, cwd=project, env=env)


def test_plan_in_a_project_sees_its_recipe_and_preset(project: Path) -> None:
    result = blocks_in(project, "plan", "recipe=mine", "optim=fastsgd", "optim.weight_decay=0.01", "--json")
    assert result.returncode == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["valid"], plan
    assert plan["choices"]["recipe"] == "mine" and plan["choices"]["optim"] == "fastsgd"
    # a project preset is typed like a block: a misspelt key is refused at compose time
    typo = blocks_in(project, "plan", "recipe=mine", "optim=fastsgd", "optim.momentun=0.9")
    assert typo.returncode == 2 and "momentum" in typo.output, typo.output


def test_list_shows_project_options_beside_blocks_own(project: Path) -> None:
    result = blocks_in(project, "list")
    assert result.returncode == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") >= 3}
    assert "fastsgd" in rows["optim"] and "sgd" in rows["optim"] and "adamw" in rows["optim"]
    assert "mine" in rows["recipe"] and "mine_wide" in rows["recipe"] and "digits_mlp" in rows["recipe"]
    assert "fast" in rows["debug"]


@pytest.mark.slow
def test_run_and_sweep_in_a_project(project: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = blocks_in(
        project, "run", "recipe=mine", "optim=fastsgd", "trainer.accelerator=cpu", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 0, result.output
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["optim"]["_block_"] == "sgd" and config["optim"]["lr"] == 0.05
    assert config["model"]["hidden"] == [8]

    sweep_dir = tmp_path / "sweep"
    swept = blocks_in(
        project,
        "run",
        "-m",
        "recipe=mine_wide",
        "optim=fastsgd",
        "trainer.accelerator=cpu",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert swept.returncode == 0, swept.output
    config = yaml.safe_load((sweep_dir / "0" / "config.yaml").read_text())
    assert config["model"]["hidden"] == [16] and config["optim"]["momentum"] == 0.5


def test_a_config_may_name_a_class_of_the_projects_recipe_dir(project: Path) -> None:
    result = blocks_in(
        project,
        "plan",
        "recipe=mine",
        "model=torch_module",
        "model.target=blocks_project._nets.TinyNet",
    )
    assert result.returncode == 0, result.output
    assert "import-not-allowed" not in result.output


def test_recipes_option_and_blocks_path_add_recipe_dirs(tmp_path: Path) -> None:
    extra = tmp_path / "more"
    extra.mkdir()
    (extra / "mine.py").write_text(MINE)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    by_option = run_cli(["--recipes", str(extra), "plan", "recipe=mine"], cwd=elsewhere)
    assert by_option.returncode == 0, by_option.output
    by_env = run_cli(["plan", "recipe=mine"], cwd=elsewhere, env={"BLOCKS_PATH": str(extra)})
    assert by_env.returncode == 0, by_env.output
    without = run_cli(["plan", "recipe=mine"], cwd=elsewhere)
    assert without.returncode == 2


TEAM_LINEAR = '''\
"""A model block of the team's own."""

from dataclasses import dataclass

from blocks import register
from blocks.model import MLP


@register("team_linear")
@dataclass(frozen=True, kw_only=True)
class TeamLinear(MLP):
    """An MLP without hidden layers."""

    hidden: tuple[int, ...] = ()
'''


def test_a_run_of_a_project_block_read_outside_the_project_says_where_the_block_is(tmp_path: Path) -> None:
    """plan.json records the project recipe file a block came from; eval, export and load_model
    outside the project name it and how to load it.

    Regression: "no model block named 'team_linear'" with the fix model=<one of mlp, ...>, and
    plan.json's ``packages`` had no entry for the block."""
    import blocks
    from blocks.spec.errors import ConfigError

    root = tmp_path / "team"
    (root / "recipes").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT.replace('conf = ["conf/"]\n', ""))
    (root / "recipes" / "linear.py").write_text(TEAM_LINEAR)
    planned = blocks_in(root, "plan", "recipe=blobs", "model=team_linear", "--json")
    assert planned.returncode == 0, planned.output
    plan = json.loads(planned.stdout)
    source = str((root / "recipes" / "linear.py").resolve())
    assert plan["packages"]["model"] == {"block": "team_linear", "project": source}
    assert plan["packages"]["data"]["distribution"] == "blocks", "the others' records are as before"

    run = tmp_path / "run"  # the run's record, as a driver writes it (nothing is trained to show the refusal)
    run.mkdir()
    config = {kind: {"_block_": block["block"], **block["fields"]} for kind, block in plan["blocks"].items()}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "plan.json").write_text(planned.stdout)
    fix = f"run from the project that defines it ({source}), or pass --recipes {root / 'recipes'}"
    for command in (["eval", str(run)], ["export", str(run), str(tmp_path / "out")]):
        result = run_in_process(command, cwd=tmp_path)
        assert result.returncode == 2, result.output
        text = " ".join(result.output.split())
        assert "model block 'team_linear' is a project's own" in text and fix in text, result.output

    export = tmp_path / "export"
    export.mkdir()
    (export / "model.json").write_text(
        json.dumps(
            {
                "model": config["model"],
                "batch_spec": {"type": "FeatureBatch", "num_features": 2, "num_classes": 3},
                "packages": plan["packages"],
            }
        )
    )
    with pytest.raises(ConfigError, match="is a project's own") as refused:
        blocks.load_model(export)
    assert refused.value.problems[0].fix.startswith(fix)


def test_a_project_recipe_named_like_a_shipped_one_is_an_error_naming_both_files(tmp_path: Path) -> None:
    root = make_project(tmp_path / "team")
    clash = root / "recipes" / "clash.py"
    clash.write_text(MINE.replace('@recipe("mine")', '@recipe("digits_mlp")').replace('"mine_wide"', '"x"'))
    result = blocks_in(root, "plan", "recipe=blobs")
    assert result.returncode == 2, result.output
    text = "".join(result.output.split())
    assert "recipe'digits_mlp'isdefinedtwice" in text, result.output
    assert str(clash) in text and "recipes/digits_mlp.py" in text, result.output


def test_a_project_preset_named_like_a_shipped_one_is_an_error_naming_both_files(tmp_path: Path) -> None:
    root = make_project(tmp_path / "team")
    (root / "conf" / "debug").mkdir()
    mine = root / "conf" / "debug" / "fast.yaml"
    mine.write_text("# @package _global_\ntrainer:\n  max_steps: 1\n")
    result = blocks_in(root, "list")
    assert result.returncode == 2, result.output
    text = "".join(result.output.split())
    assert "debug=fast" in text and str(mine) in text and "conf/debug/fast.yaml" in text, result.output


def test_run_and_plan_help_list_every_group_and_recipe() -> None:
    for command in ("run", "plan"):
        code, output = run_captured([command, "--help"])
        assert code == 0, output
        for group in ("debug", "experiment", "hparams_search", "optim", "recipe"):
            assert f"  {group}: " in output, (command, output)
        recipes = next(line for line in output.splitlines() if line.startswith("  recipe: "))
        for name in ("tiny_lm", "digits_pipeline", "digits_mlp"):  # YAML, pipeline, Python
            assert name in recipes, recipes


def test_plan_takes_config_dir_like_run(project: Path, tmp_path: Path) -> None:
    code, output = run_captured(
        ["plan", "--config-dir", str(project / "conf"), "recipe=blobs", "optim=fastsgd"]
    )
    assert code == 0, output
    run_dir = tmp_path / "refused"
    code, output = run_captured(
        [
            "run",
            "--config-dir",
            str(project / "conf"),
            "recipe=blobs",
            "optim.lr=-1",
            f"hydra.run.dir={run_dir}",
        ]
    )
    assert code == 2 and "optim.lr" in output, output
    assert not run_dir.exists()


@pytest.mark.parametrize("search", ["--config-dir", "hydra.searchpath"])
def test_a_misspelt_key_of_a_preset_on_the_search_path_gets_did_you_mean(project: Path, search: str) -> None:
    conf = project / "conf"
    where = ["--config-dir", str(conf)] if search == "--config-dir" else [f"hydra.searchpath=[file://{conf}]"]
    code, output = run_captured(["plan", *where, "recipe=blobs", "optim=fastsgd", "optim.momentun=0.9"])
    assert code == 2, output
    assert "did you mean 'momentum'?" in output and "fix: optim.momentum=..." in output, output


@pytest.fixture(scope="module")
def completion_script(project: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Hydra's bash completion, installed the way a Hydra user does, with ``blocks`` on PATH."""
    bin_dir = tmp_path_factory.mktemp("bin")
    shim = bin_dir / "blocks"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m blocks "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    script = subprocess.run(
        ["blocks", "run", "-sc", "install=bash"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert script.returncode == 0, script.stderr
    path = bin_dir / "completion.sh"
    path.write_text(script.stdout)
    return path, env


def complete(script: tuple[Path, dict[str, str]], cwd: Path, *words: str) -> list[str]:
    """Run the installed bash completion function for ``blocks WORDS<TAB>``; the candidates."""
    path, env = script
    line = "blocks " + " ".join(words)
    program = textwrap.dedent(
        f"""
        source {path}
        COMP_LINE='{line}'
        COMP_POINT=${{#COMP_LINE}}
        COMP_WORDS=(blocks {" ".join(words)})
        COMP_CWORD={len(words)}
        hydra_bash_completion
        printf '%s\\n' "${{COMPREPLY[@]}}"
        """
    )
    done = subprocess.run(
        ["bash", "-c", program], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_bash_completion_of_groups_options_and_keys(
    completion_script: tuple[Path, dict[str, str]], project: Path
) -> None:
    assert complete(completion_script, project, "run", "opt") == ["optim.", "optim="]
    keys = complete(completion_script, project, "run", "optim.")
    assert {"optim.lr=", "optim.weight_decay=", "optim.warmup_steps="} <= set(keys), keys
    assert all(key.startswith("optim.") for key in keys) and "optim._block_=" not in keys
    options = complete(completion_script, project, "run", "optim=")
    assert {"optim=adamw", "optim=sgd", "optim=fastsgd"} <= set(options), options
    sgd_keys = complete(completion_script, project, "plan", "optim=fastsgd", "optim.mom")
    assert sgd_keys == ["optim.momentum="], sgd_keys
    assert sorted(complete(completion_script, project, "r")) == ["report", "run"]


def test_digits_finetune_derives_from_digits_mlp() -> None:
    from blocks import Recipe, derive
    from blocks.core import catalog
    from blocks.core.recipe import RECIPES
    from blocks.data import Digits
    from blocks.model import MLP
    from blocks.optim import AdamW
    from blocks.task import Classification
    from blocks.trainer import Trainer

    catalog.load()
    restated = Recipe(
        data=Digits(batch_size=64, seed=1),
        model=MLP(hidden=(128, 64), freeze=("0",)),
        task=Classification(label_smoothing=0.05),
        optim=AdamW(lr=5e-4, warmup_steps=5),
        trainer=Trainer(max_epochs=None, max_steps=100, val_every=50),
    )
    assert RECIPES.get("digits_finetune").build() == restated
    assert "derive(" in Path(RECIPES.get("digits_finetune").file).read_text()
    wide = derive("digits_mlp", model=MLP(hidden=(512,)))
    assert wide.model == MLP(hidden=(512,)) and wide.optim == RECIPES.get("digits_mlp").build().optim


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"modle": {"hidden": (1,)}}, "did you mean 'model'"),
        ({"model": {"hiden": (1,)}}, "has no field 'hiden'"),
        ({"strategy": {"devices": 2}}, "leaves strategy to its default option"),
    ],
)
def test_derive_names_what_is_wrong(changes: dict, message: str) -> None:
    from blocks import derive
    from blocks.core import catalog
    from blocks.spec.errors import RegistryError

    catalog.load()
    with pytest.raises(RegistryError, match=message):
        derive("digits_mlp", **changes)


def test_a_project_preset_named_like_a_block_is_an_error_naming_both_files(tmp_path: Path) -> None:
    root = make_project(tmp_path / "team")
    mine = root / "conf" / "optim" / "sgd.yaml"
    mine.write_text("_block_: sgd\nlr: 0.5\n")
    result = blocks_in(root, "plan", "recipe=blobs")
    assert result.returncode == 2, result.output
    text = "".join(result.output.split())
    assert "optim=sgd" in text and str(mine) in text and "blocks/optim/" in text, result.output
