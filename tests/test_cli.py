"""The real command line: plan, list, and bad input that ends with exit 2 and a clear message."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO


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
        (["optim.lr=="], "optim.lr", ["Error parsing override"]),
    ],
)
def test_bad_input_exits_2_naming_the_key(cli, tmp_path, args, key, fragments) -> None:
    result = cli("run", *args)
    assert_clean_failure(result, key, *fragments)
    assert list(tmp_path.iterdir()) == [], "nothing may be written for a bad config"
    planned = cli("plan", *args)
    assert_clean_failure(planned, key, *fragments)


def test_several_problems_are_reported_together(cli) -> None:
    result = cli("plan", "optim.lr=-1", "data.batch_size=0", "model.n_heads=5")
    assert result.returncode == 2
    for key in ("optim.lr", "data.batch_size", "model.n_heads"):
        assert key in result.stdout


def test_a_bad_job_in_a_sweep_stops_the_whole_sweep(cli, tmp_path) -> None:
    result = cli("run", "-m", "recipe=blobs", "optim.lr=0.1,-1", f"hydra.sweep.dir={tmp_path}/sweep")
    assert_clean_failure(result, "optim.lr", "optim.lr=-1")
    assert not (tmp_path / "sweep").exists()


def test_plan_prints_derived_numbers(cli) -> None:
    result = cli("plan", "data.batch_size=8", "optim.accumulate=2")
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


def test_plan_imports_neither_torch_nor_lightning_and_is_fast() -> None:
    code = (
        "import sys, time\n"
        "t = time.perf_counter()\n"
        "from blocks.cli.main import cmd_plan\n"
        "code = cmd_plan(['trainer.nodes=16', 'trainer.devices=8', 'trainer.accelerator=gpu', 'precision=bf16-mixed'], as_json=True, multirun=False)\n"
        "elapsed = time.perf_counter() - t\n"
        "bad = [m for m in ('torch', 'pytorch_lightning', 'lightning') if m in sys.modules]\n"
        "print('RESULT', code, round(elapsed, 3), bad)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    _, exit_code, elapsed, bad = line.split(" ", 3)
    assert bad == "[]", f"plan imported {bad}"
    assert exit_code == "2"  # 128 ranks of strategy=single is a plan error, found without hardware
    assert float(elapsed) < 1.5


def test_plan_wall_time_of_the_command(cli) -> None:
    started = time.perf_counter()
    result = cli("plan")
    assert result.returncode == 0
    assert time.perf_counter() - started < 5  # interpreter start included; the plan itself is < 1 s


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
    assert_clean_failure(bad, "modle", "did you mean 'model'")


def test_hydra_flags_work(cli) -> None:
    result = cli("run", "--cfg", "job", "optim.lr=0.5")
    assert result.returncode == 0, result.output
    assert "lr: 0.5" in result.stdout
    assert "_block_: adamw" in result.stdout
