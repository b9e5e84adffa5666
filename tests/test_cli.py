"""The real command line: plan, list, and bad input that ends with exit 2 and a clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, read_summary


def assert_clean_failure(result, key: str, *fragments: str) -> None:
    assert result.returncode == 2, result.output
    assert "Traceback" not in result.output
    assert key in result.output
    for fragment in fragments:
        assert fragment in result.output, result.output


@pytest.mark.parametrize(
    ("args", "key", "fragments"),
    [
        (["optim.lr=abc"], "optim.lr", ["abc", "float"]),
        (["optim.lrr=1e-3"], "optim.lrr", ["did you mean 'lr'"]),
        (["strategy=dpp"], "strategy", ["no option 'dpp'", "single"]),
        (["recipe=charml"], "recipe", ["did you mean 'charlm'"]),
        (["traner.max_steps=5"], "traner", ["did you mean 'trainer'"]),
        (["optim.lr=-0.1"], "optim.lr", ["must be > 0"]),
        (["data.batch_size=0"], "data.batch_size", ["must be > 0"]),
        (["precision=16-mixed"], "precision", ["gpu", "bf16-mixed"]),
        (["model=mlp"], "model", ["TokenBatch"]),
        (["+optim.foo=1"], "optim.foo", ["no field 'foo'"]),
        (["optim.lr=="], "optim.lr", ["cannot parse the override 'optim.lr=='", "quote"]),
        (["debug.max_steps=5"], "debug.max_steps", ["'debug' chooses a preset", "trainer.max_steps=5"]),
    ],
)
def test_bad_input_exits_2_naming_the_key(cli_in_process, tmp_path, args, key, fragments) -> None:
    # In this process: a fresh `blocks run` refusing a bad config exits 2 with its message in
    # test_a_sweep_without_multirun_says_to_add_m and test_a_bad_job_in_a_sweep_stops_the_whole_sweep.
    result = cli_in_process("run", *args)
    assert_clean_failure(result, key, *fragments)
    assert list(tmp_path.iterdir()) == [], "nothing may be written for a bad config"
    planned = cli_in_process("plan", *args)
    assert_clean_failure(planned, key, *fragments)


def test_several_problems_are_reported_together(cli_in_process) -> None:
    result = cli_in_process("plan", "optim.lr=-1", "data.batch_size=0", "model.n_heads=5")
    assert result.returncode == 2
    for key in ("optim.lr", "data.batch_size", "model.n_heads"):
        assert key in result.stdout


def test_a_missing_source_is_the_only_argument_named_missing(cli_in_process) -> None:
    """``blocks eval --split test`` said 'required: source, overrides'; overrides are optional."""
    result = cli_in_process("eval", "--split", "test")
    assert result.returncode == 2
    assert "the following arguments are required: source\n" in result.stdout


def test_a_bad_job_in_a_sweep_stops_the_whole_sweep(cli, tmp_path) -> None:
    result = cli("run", "-m", "recipe=blobs", "optim.lr=0.1,-1", f"hydra.sweep.dir={tmp_path}/sweep")
    assert_clean_failure(result, "optim.lr", "optim.lr=-1")
    assert not (tmp_path / "sweep").exists()


OPTUNA = ["run", "-m", "hparams_search=optuna", "recipe=blobs", "hydra.sweeper.n_trials=2"]


def _old_sqlalchemy_for_optuna() -> bool:
    from importlib.metadata import version

    return int(version("optuna").split(".")[0]) >= 3 or int(version("sqlalchemy").split(".")[0]) < 2


@pytest.mark.parametrize(
    ("args", "key", "fragments"),
    [
        (
            ["monitor.objective=val/accuracy", "monitor.objective_mode=max", "optim.lr=choice(0.01,-1)"],
            "hydra.sweeper.direction",
            ["is minimize, but monitor.objective_mode=max", "hydra.sweeper.direction=maximize"],
        ),
        (["hydra.sweeper.direction=[minimize,maximize]"], "hydra.sweeper.direction", ["multi-objective"]),
        (["optim.lrr=interval(1e-4,1e-1)"], "optim.lrr", ["did you mean 'lr'"]),
        (["optim.lr=choice(fast,slow)"], "optim.lr", ["'fast'", "float"]),
        (
            ["hydra.sweeper.params.optim.lr=interval(1e-4,1e-1)"],
            "hydra.sweeper.params.optim.lr",
            ["'optim.lr=interval(1e-4,1e-1)'"],
        ),
        (["optim=choice(adamw,nosuchopt)"], "optim", ["no option 'nosuchopt'", "available: adamw", "sgd"]),
        (["hydra/sweeper=optuna", "optim.lr=choice(0.01,-1)"], "optim.lr", ["optim.lr=-1", "> 0"]),
        pytest.param(
            ["hydra.sweeper.storage=sqlite:///study.db"],
            "hydra.sweeper.storage",
            ["SQLAlchemy", "hydra.sweeper.storage=null"],
            marks=pytest.mark.skipif(_old_sqlalchemy_for_optuna(), reason="Optuna can use this SQLAlchemy"),
        ),
    ],
    ids=[
        "direction",
        "multi-objective",
        "unknown-key",
        "wrong-type",
        "hydra-key",
        "bad-group-choice",  # regression: only a choice's first value was planned
        "bad-value-choice",
        "storage",
    ],
)
def test_an_optuna_search_is_checked_before_any_trial(cli_in_process, tmp_path, args, key, fragments) -> None:
    result = cli_in_process(*OPTUNA, *args, f"hydra.sweep.dir={tmp_path}/sweep")
    assert_clean_failure(result, key, *fragments)
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "study.db").exists()


def test_the_keys_a_preset_searches_are_checked_before_any_trial(cli_in_process, tmp_path) -> None:
    presets = tmp_path / "presets" / "hparams_search"
    presets.mkdir(parents=True)
    (presets / "typo.yaml").write_text(
        "# @package _global_\n"
        "defaults:\n  - override /hydra/sweeper: optuna\n"
        "hydra:\n  sweeper:\n    params:\n      optim.lrr: interval(1e-4, 1e-1)\n"
    )
    args = ["--config-dir", str(tmp_path / "presets"), "hparams_search=typo", "recipe=blobs"]
    result = cli_in_process("run", "-m", *args, f"hydra.sweep.dir={tmp_path}/sweep")
    assert_clean_failure(result, "optim.lrr", "did you mean 'lr'")
    assert not (tmp_path / "sweep").exists()
    planned = cli_in_process("plan", "-m", *args, "optim.lr=interval(0.1,0.2)")
    assert_clean_failure(planned, "optim.lrr", "did you mean 'lr'")


def test_a_search_is_planned_inside_its_intervals_under_a_sweeper_a_preset_chose(
    cli_in_process, tmp_path
) -> None:
    """Regression: the trial planned before a search took an interval's low end (lr=0 refused for
    ``interval(0,0.1)``, a search that runs), and a sweeper chosen by a preset was taken for the basic one."""
    presets = tmp_path / "presets" / "experiment"
    presets.mkdir(parents=True)
    (presets / "search.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /hydra/sweeper: optuna\nhydra:\n  sweeper:\n    n_trials: 2\n"
    )
    for args in (
        [
            "recipe=blobs",
            "hparams_search=optuna",
            "optim.lr=interval(0,0.1)",
            "optim.weight_decay=tag(log,interval(1e-6,1))",
        ],
        [
            "--config-dir",
            str(tmp_path / "presets"),
            "recipe=blobs",
            "experiment=search",
            "optim.lr=interval(0.01,0.1)",
        ],
    ):
        planned = cli_in_process("plan", "-m", *args)
        assert planned.returncode == 0 and "error" not in planned.output, planned.output


def test_a_single_run_with_a_search_preset_is_not_checked_as_a_search(cli_in_process, tmp_path) -> None:
    """Regression: the Optuna direction check refused a single run (no sweep) whose objective is maximized."""
    args = [
        "hparams_search=optuna",
        "recipe=blobs",
        "monitor.objective=val/accuracy",
        "monitor.objective_mode=max",
    ]
    result = cli_in_process("run", *args, "trainer.max_steps=2", f"hydra.run.dir={tmp_path}/run")
    assert result.returncode == 0, result.output
    assert read_summary(tmp_path / "run")["status"] == "completed"
    searched = cli_in_process("plan", "-m", *args)
    assert_clean_failure(searched, "hydra.sweeper.direction", "hydra.sweeper.direction=maximize")


def test_an_experiment_preset_chooses_the_search(cli_in_process, tmp_path) -> None:
    """Regression: ``override /hparams_search: optuna`` in an experiment failed (Hydra had chosen the group
    before reading the experiment); a group listed after the experiment (debug) is refused naming the fix."""
    presets = tmp_path / "presets" / "experiment"
    presets.mkdir(parents=True)
    (presets / "search.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /hparams_search: optuna\n"
        "monitor:\n  objective: val/accuracy\n  objective_mode: max\n"
        "hydra:\n  sweeper:\n    direction: maximize\n    n_trials: 2\n"
    )
    (presets / "quick.yaml").write_text("# @package _global_\ndefaults:\n  - override /debug: fast\n")
    args = ["--config-dir", str(tmp_path / "presets"), "recipe=blobs"]
    planned = cli_in_process("plan", "-m", *args, "experiment=search", "optim=choice(adamw,sgd)")
    assert planned.returncode == 0, planned.output
    for trial in ("optim=adamw", "optim=sgd"):  # every choice, the preset's search space at its middle
        assert f"experiment=search {trial} optim.lr=0.0031622776601683794" in planned.output, planned.output
    refused = cli_in_process("plan", *args, "experiment=quick")
    assert_clean_failure(refused, "debug", "override /debug", "experiment=quick debug=<option>")


def test_an_interval_without_optuna_names_its_key_and_optuna(cli_in_process, tmp_path) -> None:
    result = cli_in_process("run", "-m", "recipe=blobs", "optim.lr=interval(0.1,0.2)")
    assert_clean_failure(result, "optim.lr: interval(0.1,0.2)", "hparams_search=optuna")
    assert list(tmp_path.iterdir()) == []


def test_a_ray_sweep_without_ray_is_refused_with_the_install(cli_in_process, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without Ray
    result = cli_in_process("run", "-m", "recipe=blobs", "hydra/launcher=ray", "trainer.seed=1,2")
    assert_clean_failure(result, "hydra/launcher", "Ray is not installed", "pip install 'blocks[ray]'")
    assert list(tmp_path.iterdir()) == []


def test_plan_prints_derived_numbers(cli_in_process) -> None:
    result = cli_in_process("plan", "data.batch_size=8", "optim.accumulate=2")
    assert result.returncode == 0, result.output
    assert "global batch" in result.stdout
    assert "\x1b[" not in result.stdout, "no control characters without a terminal"


def test_plan_json(cli) -> None:
    result = cli("plan", "--json", "recipe=blobs", "data.batch_size=8")
    assert result.returncode == 0, result.output
    data = json.loads(result.stdout)
    assert data["valid"] is True
    assert data["derived"]["micro_batch"] == 8
    invalid = cli("plan", "--json", "optim.lr=-1")
    assert invalid.returncode == 2
    assert json.loads(invalid.stdout)["problems"][0]["key"] == "optim.lr"


def test_plan_multirun_plans_every_job(cli) -> None:
    result = cli("plan", "--json", "-m", "recipe=blobs", "optim.lr=0.1,0.01", "data.batch_size=8,16")
    assert result.returncode == 0, result.output
    assert len(json.loads(result.stdout)) == 4


def test_plan_imports_neither_torch_nor_lightning_nor_fsspec() -> None:
    # How fast it plans is a benchmark (benchmarks/plan_latency.py), not a test: a loaded machine stretches any limit.
    # The default recipe's corpus is local: listing and sizing it needs no fsspec (~50 ms of imports).
    code = (
        "import sys\n"
        "from blocks.cli.main import cmd_plan\n"
        "code = cmd_plan(['trainer.nodes=16', 'trainer.devices=8', 'trainer.accelerator=gpu', 'precision=bf16-mixed'], as_json=True, multirun=False)\n"
        "bad = [m for m in ('torch', 'pytorch_lightning', 'lightning', 'fsspec') if m in sys.modules]\n"
        "print('RESULT', code, bad)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    _, exit_code, bad = line.split(" ", 2)
    assert bad == "[]", f"plan imported {bad}"
    assert exit_code == "2"  # 128 ranks of strategy=single is a plan error, found without hardware


def test_plan_command_in_a_fresh_process(cli) -> None:
    result = cli("plan")
    assert result.returncode == 0, result.output
    assert "global batch" in result.stdout


def test_a_reader_that_leaves_early_ends_the_command_without_a_traceback() -> None:
    """Regression: ``blocks list --json | head -1`` ended in a BrokenPipeError traceback (rich's tables did not)."""
    for args in (["list", "--json"], ["list"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "blocks", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO
        )
        assert proc.stdout is not None
        proc.stdout.close()  # before the command has written anything: every write meets a closed pipe
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 1, stderr
        assert b"Traceback" not in stderr and b"Exception ignored" not in stderr, stderr.decode()


def test_list_shows_every_block_with_fields(cli) -> None:
    result = cli("list", "--json")
    assert result.returncode == 0, result.output
    entries = json.loads(result.stdout)
    names = {(e["kind"], e["name"]) for e in entries}
    for expected in [
        ("data", "text"),
        ("data", "blobs"),
        ("model", "transformer"),
        ("model", "mlp"),
        ("task", "lm"),
        ("task", "classify"),
        ("optim", "adamw"),
        ("optim", "sgd"),
        ("strategy", "single"),
        ("precision", "bf16-mixed"),
        ("checkpoint", "default"),
    ]:
        assert expected in names
    adamw = next(e for e in entries if e["name"] == "adamw")
    lr = next(f for f in adamw["fields"] if f["name"] == "lr")
    assert lr["type"] == "float" and lr["default"] == 1e-3 and "learning rate" in lr["doc"]
    assert adamw["package"] == "blocks"


def test_list_one_kind_and_a_bad_kind(cli) -> None:
    result = cli("list", "model")
    assert result.returncode == 0
    assert "transformer" in result.stdout and "adamw" not in result.stdout
    bad = cli("list", "modle")
    assert_clean_failure(bad, "error kind: 'modle' is not a block kind", "did you mean 'model'")
    assert bad.stderr.startswith("blocks list: ")
    assert "KIND" not in bad.output and "nothing was started" not in bad.output


def test_list_shows_type_names_with_brackets_verbatim(cli) -> None:
    result = cli("list", "model")
    assert result.returncode == 0, result.output
    assert "hidden: tuple[int, ...] = (128, 128)" in result.stdout


@pytest.mark.parametrize(
    ("sweep", "extra_fix"),
    [("optim.lr=0.1,0.01", "key=[a,b]"), ("trainer.seed=range(3)", "")],
)
def test_a_sweep_without_multirun_says_to_add_m(cli, tmp_path, sweep, extra_fix) -> None:
    for command in ("run", "plan"):
        result = cli(command, "recipe=blobs", sweep)
        assert_clean_failure(
            result, sweep.split("=")[0], "fix: add -m (--multirun) to sweep over these values"
        )
        assert extra_fix in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_broken_recipe_files_are_warnings_on_every_command(tmp_path) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "typo.py").write_text(
        "from blocks import Recipe, recipe\n"
        "from blocks.model import MLP\n"
        "\n"
        "WIDE = MLP(hiden=(8,))\n"
        "\n"
        "@recipe('typo')\n"
        "def typo() -> Recipe:\n"
        "    return Recipe(data=None, model=WIDE, task=None)\n"
    )
    # Recipe directories of one's own are not a CLI option yet: load one, then run the real CLI.
    launcher = (
        "import sys\n"
        "from pathlib import Path\n"
        "from blocks.core import catalog\n"
        "catalog.load_recipe_files(Path(sys.argv[1]), package='user')\n"
        "from blocks.cli.main import main\n"
        "main(sys.argv[2:])\n"
    )

    def blocks(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", launcher, str(recipes), *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
            env={**os.environ, "COLUMNS": "300"},
        )

    where = f"{(recipes / 'typo.py').resolve()}:4 raised TypeError"
    for args in (["list", "--json"], ["plan", "--json", "recipe=blobs"], ["plan", "recipe=blobs"]):
        result = blocks(*args)
        assert result.returncode == 0, result.stderr
        assert f"warning recipe: {where}" in result.stderr and "hiden" in result.stderr
        assert "Traceback" not in result.stderr
    json.loads(blocks("list", "--json").stdout)  # warnings stay off stdout
    chosen = blocks("plan", "recipe=typo")
    assert chosen.returncode == 2 and "Traceback" not in chosen.stderr
    assert f"error recipe: recipe 'typo' could not be loaded: {where}" in chosen.stderr


def test_hydra_modes_that_exclude_each_other_are_a_clean_error(cli, tmp_path) -> None:
    result = cli("run", "-m", "--cfg", "job", "optim.lr=0.1,0.01")
    assert_clean_failure(result, "--cfg", "-m/--multirun and --cfg cannot be combined", "fix: drop one")
    assert list(tmp_path.iterdir()) == []


def test_hydra_flags_work(cli) -> None:
    result = cli("run", "--cfg", "job", "optim.lr=0.5")
    assert result.returncode == 0, result.output
    assert "lr: 0.5" in result.stdout
    assert "_block_: adamw" in result.stdout


RAISING_RECIPES = {
    "raises.py": "from blocks import Recipe, recipe\n\n@recipe('raises')\ndef raises() -> Recipe:\n    raise RuntimeError('boom')\n",
    "takes_args.py": "from blocks import Recipe, recipe\n\n@recipe('takes_args')\ndef takes_args(x) -> Recipe:\n    return x\n",
    "exits.py": "raise SystemExit(5)\n",
}


def test_a_recipe_that_raises_or_exits_is_a_clean_error(tmp_path) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    for name, text in RAISING_RECIPES.items():
        (recipes / name).write_text(text)
    commands = [
        ["plan", "recipe=raises"],
        ["run", "recipe=raises"],
        ["plan", "recipe=takes_args"],
        ["plan", "recipe=blobs"],
    ]
    launcher = (
        "import json, sys\n"
        "from blocks.cli.main import run_captured\n"
        "print(json.dumps([run_captured(['--recipes', sys.argv[1], *c]) for c in json.loads(sys.argv[2])]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", launcher, str(recipes), json.dumps(commands)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert done.returncode == 0, done.stderr
    (plan, run, args, blobs) = json.loads(done.stdout.splitlines()[-1])
    raises = f"recipe 'raises' could not be loaded: {(recipes / 'raises.py').resolve()}:5 raised RuntimeError: boom"
    for code, output in (plan, run):
        assert code == 2 and "Traceback" not in output, output
        assert raises in " ".join(output.split()), output
    assert args[0] == 2 and "raised TypeError" in args[1] and "Traceback" not in args[1], args[1]
    assert blobs[0] == 0, blobs[1]
    assert "exits.py:1 raised SystemExit: 5" in " ".join(blobs[1].split()), blobs[1]


def test_a_ctrl_c_while_the_command_line_is_read_exits_130_without_a_traceback(monkeypatch, capsys) -> None:
    """Regression: a Ctrl-C before the command ran (reading its arguments, importing what it needs) escaped
    ``main`` as a ``KeyboardInterrupt``: a traceback and death by SIGINT instead of exit 130."""
    import argparse

    from blocks.cli.main import main

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # what Ctrl-C raises in the middle of parsing

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", interrupted)
    ended: BaseException | None = None
    try:
        main(["plan", "recipe=blobs"])
    except BaseException as exc:  # the old code let a KeyboardInterrupt out
        ended = exc
    assert isinstance(ended, SystemExit) and ended.code == 130
    assert "interrupted (Ctrl-C)" in capsys.readouterr().err
