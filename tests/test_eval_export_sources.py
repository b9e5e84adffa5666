"""Which weights ``blocks eval``/``export`` read from a run dir, and what an export refuses to write."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from blocks.spec.errors import BlocksError
from tests.conftest import run_in_process

TINY = ["recipe=blobs", "data.samples=300", "monitor.progress=off"]


def _run(root: Path, run_dir: Path, *overrides: str) -> None:
    result = run_in_process(["run", *TINY, *overrides, f"hydra.run.dir={run_dir}"], cwd=root)
    assert result.returncode == 0, result.output[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``extended``: 10 steps completed, then on to 20 without a weights file; ``moved``: a run
    moved aside, another in its old place (``other``); ``bf16``: a run in ``precision=bf16-true``;
    ``unfinished``: 10 steps completed without checkpoints, then a rerun that failed."""
    root = tmp_path_factory.mktemp("sources")
    extended = root / "extended"
    _run(root, extended, "trainer.max_steps=10")
    _run(root, extended, "trainer.max_steps=20", "checkpoint.save_weights=false")
    _run(root, root / "a", "trainer.max_steps=10", "checkpoint.save_weights=false")
    (root / "a").rename(root / "a_old")
    _run(root, root / "a", "trainer.max_steps=20", "checkpoint.save_weights=false")
    _run(root, root / "bf16", "trainer.max_steps=5", "precision=bf16-true")
    unfinished, no_checkpoints = root / "unfinished", "checkpoint.enabled=false"
    _run(root, unfinished, "trainer.max_steps=10", no_checkpoints)
    rerun = [
        "run",
        *TINY,
        "trainer.max_steps=10",
        no_checkpoints,
        "optim.lr=1e12",
        f"hydra.run.dir={unfinished}",
    ]
    assert run_in_process(rerun, cwd=root).returncode == 1  # diverges: it writes no weights
    return {
        "extended": extended,
        "moved": root / "a_old",
        "other": root / "a",
        "bf16": root / "bf16",
        "unfinished": unfinished,
        "root": root,
    }


@pytest.mark.slow  # shares four tiny training runs
def test_a_later_session_of_the_run_dir_is_what_eval_and_export_read(
    runs: dict[str, Path], tmp_path: Path, cli_in_process
) -> None:
    from blocks.checkpoint.sources import resolve_weights
    from blocks.launch.evaluate import evaluate

    run = runs["extended"]
    newest = sorted((run / "checkpoints").glob("step-*"))[-1]
    assert newest.name.endswith("20")
    assert resolve_weights(str(run)) == str(newest), "the step-10 weights file is not the run's weights"
    assert evaluate(str(run)) == evaluate(str(newest))
    assert not (run / "model.safetensors").exists(), "a new attempt sets the old weights file aside"
    said = cli_in_process("eval", str(run))
    assert said.returncode == 0 and f"weights: {newest} (step 20)" in said.output, said.output
    # A weights file an older session left (it says its step) loses to the newer checkpoint too.
    from blocks.checkpoint.sources import find_weights, load_weights
    from blocks.checkpoint.weights import save_weights
    from blocks.runtime.model_export import export_model

    assert not (run / ".completed-model.safetensors").exists(), "stale once the rerun completed"
    save_weights(load_weights(str(newest)), tmp_path / "old.safetensors", step=10)
    assert find_weights(str(tmp_path / "old.safetensors")).step == 10
    (run / "model.safetensors").symlink_to(tmp_path / "old.safetensors")
    try:
        assert find_weights(str(run)).url == str(newest)
        meta = json.loads((export_model(str(run), tmp_path / "out") / "model.json").read_text())
    finally:
        (run / "model.safetensors").unlink()
    assert meta["source"] == str(run)
    assert {k: meta["weights"][k] for k in ("url", "step")} == {"url": str(newest), "step": 20}
    assert set(meta["weights"]["samples"]) == {"data", "seed"}, "what decided its samples, for eval"


@pytest.mark.slow  # shares four tiny training runs
def test_the_last_completed_weights_stay_the_run_dirs_while_a_later_attempt_has_not_completed(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Regression: a rerun that failed (or was stopped) set the completed run's weights aside, and
    eval, export and init_from found no weights in the run dir at all."""
    from blocks.checkpoint.sources import find_weights
    from blocks.launch.evaluate import evaluate

    run = runs["unfinished"]
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"
    found = find_weights(str(run), key="source")
    assert (found.url, found.step) == (str(run / ".completed-model.safetensors"), 10)
    assert evaluate(str(run))["val/loss"] == pytest.approx(
        json.loads((run / ".completed-summary.json").read_text())["metrics"]["val/loss"], abs=1e-6
    )
    # A rerun that completes without writing weights (checkpoint.save_weights=false): the set-aside
    # file is the run's again when it trained the same weights, and gone when it trained others.
    for seed, kept in ((0, True), (7, False)):  # 0: the seed it was trained with
        copy = tmp_path / f"seed{seed}"
        shutil.copytree(run, copy)
        _run(
            tmp_path,
            copy,
            "trainer.max_steps=10",
            "checkpoint.enabled=false",
            "checkpoint.save_weights=false",
            f"trainer.seed={seed}",
        )
        assert (copy / "model.safetensors").exists() is kept
        assert not (copy / ".completed-model.safetensors").exists()


@pytest.mark.slow  # shares four tiny training runs
def test_a_moved_run_dir_reads_its_own_checkpoints_never_another_runs(runs: dict[str, Path]) -> None:
    from blocks.checkpoint.sources import resolve_weights

    moved, other = runs["moved"], runs["other"]
    assert str(other) in (moved / "config.yaml").read_text()  # its frozen checkpoint.dir: B's now
    assert resolve_weights(str(moved), key="source") == str(moved / "checkpoints" / "step-000000010")
    assert resolve_weights(str(other)) == str(other / "checkpoints" / "step-000000020")
    shutil.move(moved / "checkpoints", runs["root"] / "a_old_checkpoints")
    try:
        with pytest.raises(BlocksError) as info:
            resolve_weights(str(moved), key="source")
    finally:
        shutil.move(runs["root"] / "a_old_checkpoints", moved / "checkpoints")
    (problem,) = info.value.problems
    assert problem.key == "source" and "saved by another run" in problem.message


@pytest.mark.slow  # shares four tiny training runs
def test_export_refuses_files_it_would_replace_and_weights_that_do_not_fit(
    runs: dict[str, Path], tmp_path: Path, cli_in_process
) -> None:
    import blocks

    source, target = str(runs["other"]), runs["extended"]
    config = (target / "config.yaml").read_bytes()
    into_run = cli_in_process("export", source, str(target))
    assert into_run.returncode == 2 and "is a run dir or an export" in into_run.output, into_run.output
    assert "choose an empty or new directory" in into_run.output
    assert (target / "config.yaml").read_bytes() == config, "nothing was replaced"
    (tmp_path / "afile").write_text("x")
    for out, said in (("afile", "is a file"), ("afile/sub", "cannot write the export to")):
        result = cli_in_process("export", source, str(tmp_path / out))
        assert result.returncode == 2 and said in result.output and "Traceback" not in result.output, (
            result.output
        )
    misfit = tmp_path / "misfit"
    shutil.copytree(runs["other"], misfit)
    (misfit / "config.yaml").write_text(
        (misfit / "config.yaml").read_text().replace("  - 64\n  - 64\n", "  - 32\n")
    )
    result = cli_in_process("export", str(misfit), str(tmp_path / "misfit-out"))
    assert result.returncode == 2 and "do not fit this model" in result.output, result.output
    assert not (tmp_path / "misfit-out").exists()
    exported = cli_in_process("export", source, str(tmp_path / "ok"))
    assert exported.returncode == 0 and "(step 20)" in exported.output, exported.output
    meta = tmp_path / "ok" / "model.json"
    meta.write_text(
        meta.read_text().replace('"hidden": [\n      64,\n      64\n    ]', '"hidden": [\n      32\n    ]')
    )
    with pytest.raises(BlocksError) as info:
        blocks.load_model(tmp_path / "ok")
    assert info.value.problems[0].check == "weights-fit"


@pytest.mark.parametrize(
    "name, why, suggested",
    [("for", "Python keyword", "for-blocks"), ("blocks", "already exists here", "my-blocks")],
)
def test_new_package_refuses_a_module_name_python_cannot_import_as_its_own(
    cli_in_process, tmp_path: Path, name: str, why: str, suggested: str
) -> None:
    result = cli_in_process("new-package", name, "--dir", str(tmp_path / "pkg"))
    assert result.returncode == 2 and why in result.output and f"e.g. {suggested}" in result.output, (
        result.output
    )
    assert not (tmp_path / "pkg").exists()


def _bf16_val_metrics_summed_in_float64(run_dir: Path) -> dict[str, float]:
    """``val/loss`` and ``val/accuracy`` of a classification run's weights cast to bfloat16, each batch's loss summed in float64."""
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from torch.utils.data import DataLoader

    from blocks.core.compose import config_to_blocks
    from blocks.runtime.model_export import run_config

    blocks = config_to_blocks(run_config(str(run_dir)))
    data = blocks["data"]
    model = blocks["model"].build(data.batch_spec())
    model.load_state_dict(load_file(str(run_dir / "model.safetensors")))
    model = model.to(torch.bfloat16).eval()
    loss, correct, samples = 0.0, 0, 0
    with torch.no_grad():
        for batch in DataLoader(data.build("val"), batch_size=data.batch_size):
            logits, targets = model(batch["inputs"].to(torch.bfloat16)).float(), batch["targets"]
            loss += F.cross_entropy(logits, targets).double().item() * targets.numel()
            correct += int((logits.argmax(-1) == targets).sum())
            samples += targets.numel()
    return {"val/loss": loss / samples, "val/accuracy": correct / samples}


@pytest.mark.slow  # shares four tiny training runs
def test_eval_scores_as_the_run_validated_and_says_where_it_cannot(
    runs: dict[str, Path], tmp_path: Path, cli_in_process
) -> None:
    from blocks.launch.evaluate import evaluate

    logged = json.loads((runs["bf16"] / "summary.json").read_text())["metrics"]
    exact = _bf16_val_metrics_summed_in_float64(runs["bf16"])
    for name in ("val/loss", "val/accuracy"):  # bf16 forward, but metrics summed in float32, not bfloat16
        assert logged[name] == pytest.approx(exact[name], rel=1e-6), (name, logged[name], exact[name])
    expected = logged["val/loss"]
    assert evaluate(str(runs["bf16"]))["val/loss"] == pytest.approx(expected, abs=1e-7), "in bf16, as trained"
    limited = tmp_path / "limited"
    shutil.copytree(runs["other"], limited)
    config = (limited / "config.yaml").read_text()
    edited = OmegaConf.create(config)
    edited.trainer.limit_val_batches, edited.data.batch_size = 1, 8  # 8 of its 30 val samples
    OmegaConf.save(edited, limited / "config.yaml")
    result = cli_in_process("eval", str(limited))
    assert result.returncode == 0 and "trainer.limit_val_batches=1" in result.output, result.output
    # Regression: the note weighed the limit with eval's batch size, not the run's.
    result = cli_in_process("eval", str(limited), "data.batch_size=256")
    assert result.returncode == 0 and "trainer.limit_val_batches=1" in result.output, result.output
    result = cli_in_process("eval", str(runs["other"] / "summary.json"))
    assert result.returncode == 2 and "it is a file, not a run dir" in result.output, result.output
    (limited / "config.yaml").write_text(config.replace("_block_: mlp", "_block_: acme/wide"))
    result = cli_in_process("eval", str(limited))
    assert result.returncode == 2 and "install the block package of the namespace 'acme'" in result.output


@pytest.mark.slow  # shares four tiny training runs
def test_a_checkpoint_is_not_scored_on_a_split_a_later_run_in_its_dir_rewrote(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Regression: a later run in the same run dir (other val_fraction, killed before its first
    checkpoint) rewrote config.yaml; eval of the earlier run's checkpoint scored it on a "val"
    split holding samples it trained on, export copied that config, and the refusal for the run
    dir named its checkpoints/ twice (absolute and relative)."""
    import contextlib

    from blocks.checkpoint.sources import resolve_weights
    from blocks.launch.evaluate import evaluation
    from blocks.runtime.model_export import export_model

    run = tmp_path / "r2"
    shutil.copytree(runs["other"], run)
    config = OmegaConf.load(run / "config.yaml")
    config.checkpoint.dir, config.data.val_fraction = str(run / "checkpoints"), 0.5
    OmegaConf.save(config, run / "config.yaml")
    (run / ".resume-start.json").write_text(json.dumps({"job": "later", "lineage": [], "foreign": []}))
    with contextlib.chdir(tmp_path), pytest.raises(BlocksError) as info:
        resolve_weights("r2", key="source")
    message = info.value.problems[0].message
    assert "saved by another run" in message and " and " not in message.split(" were saved")[0], message
    checkpoint = str(run / "checkpoints" / "step-000000020")
    for attempt in (lambda: evaluation(checkpoint), lambda: export_model(checkpoint, tmp_path / "out")):
        with pytest.raises(BlocksError) as info:
            attempt()
        (problem,) = info.value.problems
        assert (problem.key, problem.check) == ("source", "eval-split"), problem
        assert "another data than" in problem.message, problem.message
    assert not (tmp_path / "out").exists()
    config.data.val_fraction = 0.1  # the config it trained with: scored as before
    OmegaConf.save(config, run / "config.yaml")
    assert evaluation(checkpoint).metrics["val/loss"] > 0


@pytest.mark.slow  # shares four tiny training runs
def test_a_weights_file_or_export_is_not_scored_on_a_split_its_config_yaml_no_longer_describes(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Regression: only checkpoints recorded what decided their samples. After a later run in the
    run dir (other val_fraction, failed) rewrote config.yaml, eval and export of the run dir's
    weights file, and eval of an export whose config.yaml says another split, scored the model on
    samples it trained on. An export written before the record existed is scored, with a note."""
    from blocks.checkpoint.sources import load_weights
    from blocks.checkpoint.weights import save_weights
    from blocks.launch.evaluate import evaluation
    from blocks.runtime.model_export import export_model

    run = tmp_path / "run"
    shutil.copytree(runs["unfinished"], run)  # its completed weights set aside by the failed rerun
    exported = export_model(str(run), tmp_path / "exported")
    for directory in (run, exported):
        config = OmegaConf.load(directory / "config.yaml")
        config.data.val_fraction = 0.5
        OmegaConf.save(config, directory / "config.yaml")
    attempts = (
        lambda: evaluation(str(run)),
        lambda: export_model(str(run), tmp_path / "again"),
        lambda: evaluation(str(exported)),
    )
    for attempt in attempts:
        with pytest.raises(BlocksError) as info:
            attempt()
        (problem,) = info.value.problems
        assert (problem.key, problem.check) == ("source", "eval-split"), problem
        assert "another data than" in problem.message, problem.message
    assert not (tmp_path / "again").exists()
    assert set(json.loads((exported / "model.json").read_text())["weights"]["samples"]) == {"data", "seed"}
    save_weights(load_weights(str(exported)), exported / "model.safetensors", step=10)  # an older export
    scored = evaluation(str(exported))
    assert scored.metrics["val/loss"] > 0
    assert any("does not record the data it was trained on" in note for note in scored.notes), scored.notes
