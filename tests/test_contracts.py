"""Every named check: a config that violates it reports the check on its exact key.

The examples are those of ``blocks.core.checks.CHECKS``, which the docs' conflict table is
generated from; so these tests also keep that table true.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from blocks.core import jobs
from blocks.core.checks import CHECKS, CPU, Check, problems_of, triggered
from blocks.core.environment import Environment
from blocks.spec.errors import ConfigError
from tests.conftest import REPO

EXEMPLIFIED = [c for c in CHECKS if c.example]


# Checks that need files or a missing package to fire, or that the build layer runs on the
# weights; tests/test_recipes.py and tests/test_cli.py trigger them.
# Checks made when a run starts (the driver's preflight, the import of a path) or on files:
# each is tested where it fires (test_security, test_faults_checkpoints, test_faults_storage, ...).
WITHOUT_PLAN_EXAMPLE = [
    "compile-cxx",  # needs a machine without a C++ compiler: tests/test_compile.py
    "mesh-world-size",  # no built-in strategy declares another mesh: tests/test_mesh_ranks.py
    "split-count",  # no built-in data block miscounts: tests/test_batch_contract.py
    "data-extra",
    "weights-source",
    "weights-fit",
    "eval-split",  # an eval override against the run's config: tests/test_eval_test_split.py
    "eval-split-samples",  # a split against the run's config: tests/test_eval_test_split.py, tests/test_faults_pipeline.py
    "freeze-prefix",
    "recipe-load",
    "yaml-syntax",  # needs a broken preset file: tests/test_security_hydra.py
    "block-import",  # needs a block whose module cannot be imported: tests/test_catalog_value.py
    "block-raised",  # a package's block that raises: tests/test_package_discovery.py
    "worker-blocks",  # a block only the launching program registers: tests/test_train.py
    "name-clash",
    "project-config",
    "import-kind",
    "logger-start",
    "callback-refused",  # Lightning refuses it at set-up: tests/test_lightning_habits.py
    "loader-options",
    "checkpoint-unsafe",
    "resume-usable",
    "checkpoint-dir-foreign",  # needs a checkpoint dir holding a user's entry: tests/test_faults_checkpoints.py
    "sweep-checkpoint-dir",  # a check across a sweep's jobs: tests/test_faults_silent.py
    "sweep-objective",  # a check across a sweep's jobs: tests/test_faults_silent.py
    "sweep-run-dir",  # a check across a sweep's jobs: tests/test_faults_silent.py, tests/test_faults_processes.py
    "checkpoint-storage",
    "ray-placement",
    "optuna-storage",  # depends on the installed SQLAlchemy: tests/test_run_cli.py
]


def test_every_check_but_file_loading_has_an_example() -> None:
    assert [c.name for c in CHECKS if not c.example] == WITHOUT_PLAN_EXAMPLE


@pytest.mark.parametrize("check", EXEMPLIFIED, ids=[c.name for c in EXEMPLIFIED])
def test_each_check_names_its_key(check: Check) -> None:
    problems = problems_of(check)
    problem = triggered(check, problems)
    assert problem is not None, [(p.check, p.key, p.message) for p in problems]
    assert problem.key == check.key, problem
    assert problem.message and problem.fix, problem
    for key in problem.related:
        assert key.split(".", 1)[0] in {
            "data",
            "model",
            "task",
            "optim",
            "strategy",
            "precision",
            "checkpoint",
            "trainer",
            "monitor",
        }


def test_every_check_in_the_code_is_in_the_catalog() -> None:
    written = set()
    for path in (REPO / "blocks").rglob("*.py"):
        written |= set(re.findall(r'check="([a-z0-9-]+)"', path.read_text()))
    source = (REPO / "blocks" / "core" / "compose.py").read_text()
    omegaconf_checks = source.split("def _omegaconf_check", 1)[1].split("\ndef ", 1)[0]
    written |= set(re.findall(r'return "([a-z0-9-]+)"', omegaconf_checks))
    refusals = (
        (REPO / "blocks" / "spec" / "imports.py")
        .read_text()
        .split("def _refusal", 1)[1]
        .split("\ndef ", 1)[0]
    )
    written |= set(re.findall(r'"(import-[a-z-]+)"', refusals))
    catalog = {c.name for c in CHECKS}
    assert written - catalog == set(), "checks without a catalog entry (and docs row)"
    assert catalog - written == set(), "catalog entries no code reports"


def test_contracts_relate_the_keys_of_both_blocks() -> None:
    problem = triggered(next(c for c in CHECKS if c.name == "seq-len-context"))
    assert problem is not None and problem.related == ("data.seq_len",)
    assert "data.seq_len=512" in problem.message and "model.context=512" in problem.fix


def test_a_valid_job_has_no_problems() -> None:
    plan = jobs.plan([], CPU)
    assert plan.ok and not plan.warnings, [p.render() for p in plan.problems]


# --- errors: all at once, did-you-mean, Hydra and OmegaConf errors in the same style ---------


def test_composition_and_plan_problems_are_reported_together() -> None:
    with pytest.raises(ConfigError) as info:
        jobs.plan(["model.d_model=abc", "optim.lrr=1", "data.batch_size=0", "strategy=dpp"], CPU)
    found = {(p.key, p.check) for p in info.value.problems}
    assert found == {
        ("model.d_model", "type"),
        ("optim.lrr", "unknown-key"),
        ("strategy", "unknown-option"),
        ("data.batch_size", "range"),
    }, found


def test_block_field_problems_and_plan_problems_are_reported_together() -> None:
    with pytest.raises(ConfigError) as info:
        jobs.plan(["+optim.nope=1", "optim.lr=???", "model.n_heads=5"], CPU)
    found = {(p.key, p.check) for p in info.value.problems}
    assert found == {
        ("optim.nope", "unknown-key"),
        ("optim.lr", "missing-value"),
        ("model.n_heads", "heads-divide-width"),
    }, found


def test_a_key_of_another_block_names_the_blocks_that_have_it() -> None:
    with pytest.raises(ConfigError) as info:
        jobs.plan(["strategy.backend=gloo"], CPU)
    (problem,) = info.value.problems
    assert problem.key == "strategy.backend"
    assert "strategy=ddp, strategy=fsdp" in problem.fix


@pytest.mark.parametrize(
    ("override", "key", "fix"),
    [
        ("optim.lr=null", "optim.lr", "cannot be null"),
        ("model.hidden=3", "model.hidden", "model.hidden=[64,64]"),
        ("optim.lr=${oc.env:BLOCKS_NOT_SET}", "optim.lr", "set the environment variable BLOCKS_NOT_SET"),
        ("data.batch_size=${optim.lr}", "data.batch_size", "type integer"),
        ("data=null", "data", "blocks list data"),
    ],
)
def test_omegaconf_errors_name_the_key_and_a_fix(override: str, key: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        jobs.plan(["recipe=blobs", override], CPU)
    problem = info.value.problems[0]
    assert problem.key == key and fix in problem.fix, problem


# --- derived numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize(("rule", "factor"), [("none", 1.0), ("linear", 4.0), ("sqrt", 2.0)])
def test_lr_scaling_rule_sets_the_effective_lr(rule: str, factor: float) -> None:
    plan = jobs.plan(
        [
            "recipe=blobs",
            "data.batch_size=64",
            "optim.accumulate=4",
            f"optim.lr_scaling={rule}",
            "optim.reference_batch=64",
        ],
        CPU,
    )
    assert plan.ok
    assert plan.derived.global_batch == 256
    assert plan.derived.effective_lr == pytest.approx(plan.optim.lr * factor)


def test_memory_estimate_shards_under_fsdp_and_shrinks_with_checkpointing() -> None:
    gpu = Environment(gpus=8, gpu_memory_bytes=80 * 2**30)
    common = ["trainer.devices=8", "trainer.accelerator=gpu", "precision=bf16-mixed"]
    ddp = jobs.plan(["strategy=ddp", *common], gpu).derived.memory
    fsdp = jobs.plan(["strategy=fsdp", *common], gpu).derived.memory
    recomputed = jobs.plan(
        ["strategy=fsdp", "strategy.activation_checkpointing=true", *common], gpu
    ).derived.memory
    assert ddp and fsdp and recomputed
    assert not ddp.sharded and fsdp.sharded
    assert fsdp.optimizer == pytest.approx(ddp.optimizer / 8, rel=0.01)
    assert fsdp.gradients == pytest.approx(ddp.gradients / 8, rel=0.01)
    assert recomputed.activations is not None and fsdp.activations is not None
    assert recomputed.activations < fsdp.activations / 2
    assert ddp.device == 80 * 2**30 and ddp.device_source == "detected GPU"


def test_over_budget_is_a_warning_with_the_cheapest_fixes() -> None:
    plan = jobs.plan(["trainer.device_memory_gb=0.05"], CPU)
    assert plan.ok  # a warning: the estimate is an estimate
    (problem,) = [p for p in plan.warnings if p.check == "memory-budget"]
    assert "data.batch_size=" in problem.fix and "optim.accumulate=" in problem.fix
    assert "same global batch of 32" in problem.fix
    assert "strategy=fsdp strategy.activation_checkpointing=true" in problem.fix


def test_planning_a_128_gpu_fsdp_job_is_torch_free() -> None:
    """A fresh process plans a 128-GPU FSDP job without importing torch or Lightning.

    How fast it plans is a benchmark (``python -m benchmarks --only plan``), not a test: a time
    limit flakes on a shared machine.
    """
    code = (
        "import sys\n"
        "from blocks.cli.main import cmd_plan\n"
        "code = cmd_plan(['trainer.nodes=16', 'trainer.devices=8', 'strategy=fsdp', 'trainer.accelerator=gpu',"
        " 'precision=bf16-mixed', 'data.batch_size=2', 'trainer.device_memory_gb=80'], as_json=True, multirun=False)\n"
        "print('RESULT', code, 'torch' in sys.modules, 'pytorch_lightning' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    assert line.split()[1:] == ["0", "False", "False"], proc.stdout[-2000:]
    assert '"world_size": 128' in proc.stdout and '"sharded": true' in proc.stdout


def test_plan_shows_the_memory_estimate(cli) -> None:
    result = cli("plan", "trainer.device_memory_gb=16")
    assert result.returncode == 0, result.output
    for text in (
        "memory per device",
        "optimizer state",
        "activations",
        "device memory (trainer.device_memory_gb)",
    ):
        assert text in result.stdout


def test_the_optimizer_uses_the_effective_lr(tmp_path) -> None:
    import csv

    from blocks.launch.driver import run

    args = [
        "recipe=blobs",
        "data.batch_size=32",
        "optim.lr=0.01",
        "optim.lr_scaling=linear",
        "optim.reference_batch=8",
        "optim.schedule=constant",
        "optim.warmup_steps=0",
        "trainer.max_steps=2",
        "trainer.max_epochs=null",
        "monitor.log_every_n_steps=1",
        "monitor.progress=off",
        "checkpoint.enabled=false",
    ]
    summary = run(args, tmp_path)
    assert summary.status == "completed"
    with open(tmp_path / "metrics.csv") as fh:
        rates = [float(row["lr"]) for row in csv.DictReader(fh) if row.get("lr")]
    assert rates and all(rate == pytest.approx(0.04) for rate in rates), rates
