"""The shipped recipes, fine-tuning from another run, ``blocks eval``/``export`` and pipelines of stages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from blocks.core import catalog
from tests.catalog_fixtures import fresh_catalog
from tests.conftest import blocks_run_until_step, read_summary, run_in_process

pytestmark = pytest.mark.timeout(600)

catalog.load()
SHIPPED = fresh_catalog().recipes.entries()  # blocks' own recipes, none a test module added
SINGLE = sorted(e.name for e in SHIPPED if e.pipeline() is None)
PIPELINES = sorted(e.name for e in SHIPPED if e.pipeline() is not None)


def test_the_new_recipes_are_shipped() -> None:
    assert {"digits_mlp", "diabetes_mlp", "digits_finetune"} <= set(SINGLE)
    assert "digits_pipeline" in PIPELINES


@pytest.mark.parametrize("name", SINGLE + PIPELINES)
def test_every_recipe_plans(cli_in_process, name: str) -> None:
    result = cli_in_process("plan", f"recipe={name}")
    assert result.returncode == 0, result.output[-3000:]
    assert "valid" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", SINGLE)
def test_every_recipe_trains_a_few_steps(cli_in_process, tmp_path: Path, name: str) -> None:
    # Small batches and one validation batch: the recipe's blocks train together, at a CPU's pace.
    small = ["data.batch_size=4", "trainer.limit_val_batches=1"]
    result = cli_in_process(
        "run", f"recipe={name}", "debug=fast", *small, f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert result.returncode == 0, result.output[-3000:]
    summary = read_summary(tmp_path / "run")
    assert summary["status"] == "completed" and summary["global_step"] == 5


@pytest.mark.slow
def test_digits_classifier_reaches_its_stated_accuracy_on_cpu(trained: Path) -> None:
    # The module's `trained` run is this: `blocks run recipe=digits_mlp debug=cpu`, the recipe as shipped.
    summary = read_summary(trained)
    assert summary["status"] == "completed" and summary["global_step"] == 300, summary
    assert summary["metrics"]["val/accuracy"] >= 0.9, summary["metrics"]


def test_diabetes_regression_explains_part_of_the_variance(cli_in_process, tmp_path: Path) -> None:
    result = cli_in_process("run", "recipe=diabetes_mlp", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.output[-3000:]
    metrics = read_summary(tmp_path / "run")["metrics"]
    assert metrics["val/r2"] > 0.3 and metrics["val/mae"] > 0, metrics


def test_without_scikit_learn_the_plan_names_the_extra(tmp_path: Path) -> None:
    hide = "import sys; sys.modules['sklearn'] = None; from blocks.cli.main import main; main(sys.argv[1:])"
    proc = subprocess.run(
        [sys.executable, "-c", hide, "plan", "recipe=digits_mlp"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=120,
    )
    assert proc.returncode == 2
    output = proc.stdout + proc.stderr
    assert "needs scikit-learn" in output and "pip install 'blocks[sklearn]'" in output


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished digits_mlp run: ``blocks run recipe=digits_mlp debug=cpu``, the recipe's 300 steps as shipped.

    The recipe's stated accuracy is checked on it; fine-tuning, eval and export start from it.
    """
    root = tmp_path_factory.mktemp("trained")
    result = run_in_process(
        ["run", "recipe=digits_mlp", "debug=cpu", f"hydra.run.dir={root / 'run'}"], cwd=root
    )
    assert result.returncode == 0, result.output[-3000:]
    return root / "run"


@pytest.mark.slow
def test_finetune_starts_from_the_run_and_keeps_frozen_layers(
    cli_in_process, tmp_path: Path, trained: Path
) -> None:
    from safetensors.torch import load_file

    run = tmp_path / "ft"
    result = cli_in_process(
        "run",
        "recipe=digits_finetune",
        f"model.init_from={trained}",
        "trainer.max_steps=30",
        f"hydra.run.dir={run}",
    )
    assert result.returncode == 0, result.output[-3000:]
    before, after = load_file(trained / "model.safetensors"), load_file(run / "model.safetensors")
    assert set(before) == set(after)
    for name in before:
        same = bool((before[name] == after[name]).all())
        assert same == name.startswith("0."), name
    # Started from the trained weights: accuracy is high after a few steps at a low learning rate.
    assert read_summary(run)["metrics"]["val/accuracy"] > 0.85


def test_freeze_and_init_from_mistakes_name_the_key(cli_in_process, tmp_path: Path) -> None:
    result = cli_in_process(
        "run", "recipe=digits_finetune", "model.freeze=[nope]", f"hydra.run.dir={tmp_path / 'a'}"
    )
    assert result.returncode == 2
    assert "model.freeze: 'nope' matches no parameter" in result.output and "0, 2, 4" in result.output
    result = cli_in_process(
        "run", "recipe=digits_finetune", f"model.init_from={tmp_path}/none", f"hydra.run.dir={tmp_path / 'b'}"
    )
    assert result.returncode == 2
    assert "model.init_from: cannot load weights" in result.output


@pytest.mark.slow
def test_eval_reproduces_the_runs_validation_metrics(
    cli_in_process, trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = cli_in_process("eval", str(trained), "--json", apart=True)
    assert result.returncode == 0, result.output[-3000:]
    metrics = json.loads(result.stdout)
    expected = read_summary(trained)["metrics"]
    assert metrics["val/accuracy"] == pytest.approx(expected["val/accuracy"], abs=1e-6)
    assert metrics["val/loss"] == pytest.approx(expected["val/loss"], rel=1e-5)
    checkpoint = sorted((trained / "checkpoints").glob("step-*"))[-1]
    result = cli_in_process(
        "eval", str(checkpoint), "data.batch_size=256", "--split", "val", "--json", apart=True
    )
    assert result.returncode == 0, result.output[-3000:]
    assert json.loads(result.stdout)["val/accuracy"] > 0.8
    result = cli_in_process("eval", str(trained), "data=text")
    assert result.returncode == 2 and "data=text yields TokenBatch" in result.output
    monkeypatch.setenv("BLOCKS_TEST_SECRET", "not-a-batch-size-s3cr3t")
    result = cli_in_process("eval", str(trained), "data.batch_size=${oc.env:BLOCKS_TEST_SECRET}")
    assert result.returncode == 2 and "data.batch_size" in result.output, result.output[-3000:]
    assert "not-a-batch-size-s3cr3t" not in result.output, (
        "a secret read by an override is hidden in the error"
    )


LOAD_BACK = """
import json, sys
import torch
import blocks
model = blocks.load_model(sys.argv[1])
inputs = torch.load(sys.argv[2])
print(json.dumps({"outputs": model(inputs).tolist(), "lightning": "pytorch_lightning" in sys.modules}))
"""


def test_export_loads_back_without_training_code_and_reproduces_outputs(
    cli_in_process, tmp_path: Path, trained: Path
) -> None:
    import torch

    from blocks.checkpoint.export import checkpoint_weights
    from blocks.data import Digits
    from blocks.model import MLP

    result = cli_in_process("export", str(trained), str(tmp_path / "export"))
    assert result.returncode == 0, result.output[-3000:]
    assert {p.name for p in (tmp_path / "export").iterdir()} == {
        "model.safetensors",
        "model.json",
        "config.yaml",
    }
    inputs = Digits().build("val").inputs[:16]
    torch.save(inputs, tmp_path / "inputs.pt")
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_BACK, str(tmp_path / "export"), str(tmp_path / "inputs.pt")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout)
    assert loaded["lightning"] is False
    # The reference: the network rebuilt from the run's last committed checkpoint.
    reference = MLP(hidden=(128, 64)).build(Digits().batch_spec())
    checkpoint = sorted((trained / "checkpoints").glob("step-*"))[-1]
    reference.load_state_dict(checkpoint_weights(str(checkpoint)))
    expected = reference.eval()(inputs)
    assert torch.allclose(torch.tensor(loaded["outputs"]), expected, atol=1e-6)


PIPE = ["recipe=digits_pipeline", "pretrain.trainer.max_steps=40", "monitor.log_every_n_steps=1"]


@pytest.mark.slow
def test_pipeline_runs_end_to_end_then_skips_finished_stages(cli_in_process, tmp_path: Path) -> None:
    root = tmp_path / "pipe"
    result = cli_in_process("run", *PIPE, "finetune.trainer.max_steps=20", f"hydra.run.dir={root}")
    assert result.returncode == 0, result.output[-3000:]
    assert {p.name for p in root.iterdir()} == {"pretrain", "finetune", "evaluate", "export", "pipeline.json"}
    finetune = read_summary(root / "finetune")
    assert read_summary(root / "pretrain")["global_step"] == 40 and finetune["global_step"] == 20
    config = (root / "finetune" / "config.yaml").read_text()
    assert f"init_from: {(root / 'pretrain').resolve()}" in config
    metrics = json.loads((root / "evaluate" / "metrics.json").read_text())
    assert metrics["val/accuracy"] == pytest.approx(finetune["metrics"]["val/accuracy"], abs=1e-6)
    assert (root / "export" / "model" / "model.json").is_file()
    again = cli_in_process("run", *PIPE, "finetune.trainer.max_steps=20", f"hydra.run.dir={root}")
    assert again.returncode == 0, again.output[-3000:]
    for stage in ("pretrain", "finetune", "evaluate", "export"):
        assert f"stage {stage}: finished earlier, skipped" in again.stdout


@pytest.mark.slow
def test_pipeline_killed_during_finetune_skips_pretrain_and_resumes(tmp_path: Path) -> None:
    root = tmp_path / "pipe"
    args = [
        *PIPE,
        "finetune.trainer.max_steps=200",
        "finetune.checkpoint.every_n_steps=10",
        f"hydra.run.dir={root}",
    ]
    with blocks_run_until_step(args, cwd=tmp_path, step=60) as proc:  # pretrain never reaches step 60
        os.killpg(proc.pid, signal.SIGKILL)
    assert read_summary(root / "pretrain")["status"] == "completed"
    pretrain_summary = (root / "pretrain" / "summary.json").read_text()
    assert not (root / "finetune" / "summary.json").exists()
    result = run_in_process(["run", *args], cwd=tmp_path)  # the rerun: a one-process pipeline
    assert result.returncode == 0, result.output[-3000:]
    assert "stage pretrain: finished earlier, skipped" in result.stdout
    assert (root / "pretrain" / "summary.json").read_text() == pretrain_summary
    finetune = read_summary(root / "finetune")
    assert finetune["status"] == "completed" and finetune["global_step"] == 200
    assert finetune["resumed_from"] and "step-0000000" in finetune["resumed_from"]
    assert (root / "export" / "model" / "model.safetensors").is_file()


def test_a_stage_a_signal_stopped_says_to_resume_with_the_pipelines_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the advice named the stage's dir, where the pipeline would train a new run from step 0."""
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    root = tmp_path / "pipe"
    ctrl_c = "pretrain.trainer.callbacks=[{_target_: tests.lightning_habits.SignalAtStep, step: 2, signal_name: SIGINT}]"
    result = run_in_process(["run", *PIPE, ctrl_c, f"hydra.run.dir={root}"], cwd=tmp_path)
    assert result.returncode == 130, result.output[-3000:]
    summary = read_summary(root / "pretrain")
    assert summary["status"] == "interrupted" and summary["global_step"] == 2, summary
    assert summary["reason"].endswith(f"to resume, run the same command with hydra.run.dir={root}"), summary
    assert not (root / "finetune").exists()


def test_a_pipeline_refuses_hydra_flags(cli_in_process) -> None:
    result = cli_in_process("run", "recipe=digits_pipeline", "-m")
    assert result.returncode == 2 and "is a pipeline" in result.output


@pytest.mark.slow
def test_debug_overfit_memorizes_a_few_batches(cli_in_process, tmp_path: Path) -> None:
    result = cli_in_process("run", "recipe=digits_mlp", "debug=overfit", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.output[-3000:]
    metrics = read_summary(tmp_path / "run")["metrics"]
    assert metrics["val/accuracy"] == 1.0 and metrics["val/loss"] < 0.1, metrics


def test_experiment_preset_pins_a_recipe_and_its_changes(cli_in_process) -> None:
    result = cli_in_process("plan", "experiment=digits_wide", "--json")
    assert result.returncode == 0, result.output[-3000:]
    plan = json.loads(result.stdout)
    assert plan["choices"]["recipe"] == "digits_mlp" and plan["choices"]["experiment"] == "digits_wide"
    assert plan["blocks"]["model"]["fields"]["hidden"] == [256, 256]


def test_pipeline_stages_refer_to_earlier_train_stages() -> None:
    from blocks import Evaluate, Export, Pipeline, Train
    from blocks.spec.errors import RegistryError

    with pytest.raises(RegistryError, match="source='pretrain', which is not an earlier train stage"):
        Pipeline(stages=(Evaluate("evaluate", source="pretrain"), Train("pretrain")))
    with pytest.raises(RegistryError, match="init_from='evaluate'"):
        Pipeline(stages=(Train("a"), Evaluate("evaluate", source="a"), Train("b", init_from="evaluate")))
    with pytest.raises(RegistryError, match="must be lower_snake_case and not one of"):
        Pipeline(stages=(Train("model"),))
    with pytest.raises(RegistryError, match="appears twice"):
        Pipeline(stages=(Train("a"), Export("a", source="a")))


def test_planning_a_pipeline_shows_every_stage_and_finds_an_evaluations_problem(tmp_path: Path) -> None:
    """``blocks plan`` of a pipeline checks what ``blocks run`` checks before its first stage, evaluations included."""
    result = run_in_process(["plan", "recipe=digits_pipeline", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert result.returncode == 0, result.output
    for stage in ("pretrain", "finetune", "evaluate", "export"):
        assert f"stage: {stage}" in result.output
    assert "evaluate finetune's model on its val split" in result.output
    bad = ["plan", "recipe=digits_pipeline", "evaluate.data.batch_size=0", f"hydra.run.dir={tmp_path}"]
    result = run_in_process(bad, cwd=tmp_path)
    assert result.returncode == 2, result.output
    text = " ".join(result.output.split())
    assert "stage 'evaluate' of recipe=digits_pipeline has problems" in text and "data.batch_size" in text
    # Regression: a split the evaluated run has no samples in was found only at the stage, after training.
    no_val = ["finetune.data.val_fraction=0", "finetune.trainer.val_every=null"]
    result = run_in_process([*bad[:2], *no_val, *bad[3:]], cwd=tmp_path)
    text = " ".join(result.output.split())
    assert result.returncode == 2 and "error split: data=digits has no val split (0 samples)" in text, text

    listed = run_in_process([*bad, "--json"], cwd=tmp_path)
    assert listed.returncode == 2
    stages = json.loads(listed.stdout)
    assert list(stages) == ["pretrain", "finetune", "evaluate", "export"], "every stage, in order"
    assert stages["finetune"]["valid"] and stages["export"] == {
        "stage": "export",
        "does": "export finetune's model",
        "valid": True,
        "problems": [],
    }
    assert not stages["evaluate"]["valid"] and stages["evaluate"]["problems"][0]["key"] == "data.batch_size"
    unchecked = json.loads(run_in_process([*bad, "pretrain.optim.lr=-1", "--json"], cwd=tmp_path).stdout)
    assert not unchecked["pretrain"]["valid"] and unchecked["evaluate"]["valid"] is None, (
        "an evaluation is not checked while a train stage has problems: not claimed valid"
    )
    assert not any(tmp_path.iterdir()), "planning writes nothing"


def test_planning_a_pipeline_imports_neither_torch_nor_sklearn(tmp_path: Path) -> None:
    check = (
        "import sys\nfrom blocks.cli.main import main\ntry:\n    main(['plan', 'recipe=digits_pipeline'])\n"
        "except SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
        "print(sorted(m for m in ('torch', 'pytorch_lightning', 'sklearn') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
