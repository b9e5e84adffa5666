"""Checkpoints that never lose work: commit protocol, exact resume after kill -9, retention, s3, FSDP."""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from blocks.checkpoint import store
from blocks.checkpoint.export import checkpoint_weights, export_checkpoint
from blocks.optim.schedule import lr_factor
from tests.conftest import FSDP_LM, blocks_run_until_step, moto_s3_server, read_summary, run_in_process

pytestmark = pytest.mark.timeout(600)

LM = [
    "recipe=tiny_lm",
    "trainer.max_steps=24",
    "trainer.val_every=8",
    "monitor.log_every_n_steps=1",
    "checkpoint.every_n_steps=3",
    "model.dropout=0.1",
]
DDP = ["strategy=ddp", "trainer.devices=2", "data.batch_size=8"]
MULTI_PROCESS = pytest.mark.xdist_group("torchrun")
"""The group of a test case that starts several processes where conftest's text signs do not see it
(the ``DDP`` case of a parametrized test): named here, so the test's own source does not put its
other cases in the group too."""


def trained(args: list[str], run_dir: Path) -> dict:
    """A setup run, trained in this process (``blocks.launch.driver.run``, the Python ``blocks run``).

    For the runs a test only needs to exist: the run under test is still a ``blocks run`` process.
    """
    from blocks.launch.driver import run

    summary = run(args, run_dir)
    assert summary.status == "completed", summary
    return read_summary(run_dir)


@pytest.fixture(scope="module")
def lm_run_of_9_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir of :data:`LM` trained 9 steps in this process: committed checkpoints at steps 6 and 9.

    Shared by the tests that only need a short LM run to resume, refuse or tamper with: each
    copies it (:func:`copy_of`) before it changes anything.
    """
    run_dir = tmp_path_factory.mktemp("lm-9") / "run"
    trained([*LM, "trainer.max_steps=9"], run_dir)
    return run_dir


def copy_of(run_dir: Path, target: Path) -> Path:
    """A copy of the finished run dir *run_dir* at *target* (the same run, for a rerun there to resume)."""
    shutil.copytree(run_dir, target)
    return target


def run_and_kill_at(args: list[str], cwd: Path, step: int) -> None:
    """Start a run and SIGKILL it (driver and workers) once it logs *step*: a machine dying mid-run."""
    with blocks_run_until_step(args, cwd=cwd, step=step) as proc:
        os.killpg(proc.pid, signal.SIGKILL)


def digest_of_uninterrupted(args: list[str], cwd: Path) -> tuple[str, str]:
    run_dir = cwd / "uninterrupted"
    return trained(args, run_dir)["state_digest"], (run_dir / "metrics.csv").read_text()


def metric_columns(csv_text: str, columns: int = 3) -> list[str]:
    return [",".join(line.split(",")[:columns]) for line in csv_text.splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "kill_steps"), [("single", 2), pytest.param("ddp", 1, marks=MULTI_PROCESS)]
)
def test_kill_9_and_rerun_reaches_the_uninterrupted_digest(
    tmp_path: Path, layout: str, kill_steps: int
) -> None:
    args = LM + (DDP if layout == "ddp" else [])
    expected_digest, expected_metrics = digest_of_uninterrupted(args, tmp_path)
    picker = random.Random(f"{layout}-kill-points")
    for attempt, step in enumerate(sorted(picker.sample(range(4, 22), kill_steps))):
        run_dir = tmp_path / f"killed-{attempt}"
        run_and_kill_at([*args, f"hydra.run.dir={run_dir}"], tmp_path, step)
        assert not (run_dir / "summary.json").exists() or read_summary(run_dir)["status"] != "completed"
        result = run_in_process(["run", *args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        assert result.returncode == 0, result.output[-3000:]
        summary = read_summary(run_dir)
        assert summary["resumed_from"], f"killed at step {step}: the rerun must resume"
        assert summary["state_digest"] == expected_digest, f"killed at step {step}"
        assert metric_columns((run_dir / "metrics.csv").read_text()) == metric_columns(expected_metrics)


@pytest.mark.slow
def test_uncommitted_newest_checkpoint_is_ignored_and_cleaned(
    tmp_path: Path, lm_run_of_9_steps: Path
) -> None:
    """What a kill during a save leaves: files of the newest step without a manifest."""
    run_dir = copy_of(lm_run_of_9_steps, tmp_path / "run")
    checkpoints = run_dir / "checkpoints"
    newest = checkpoints / store.step_dir_name(9)
    half_written = checkpoints / store.step_dir_name(12)
    shutil.copytree(newest, half_written)
    (half_written / store.MANIFEST).unlink()
    with (half_written / "state.pt").open("r+b") as fh:
        fh.truncate(1000)
    result = run_in_process(["run", *LM, "trainer.max_steps=15", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    summary = read_summary(run_dir)
    assert summary["resumed_from"].endswith(store.step_dir_name(9))
    assert summary["global_step"] == 15
    assert not half_written.exists() or (half_written / store.MANIFEST).exists()


@pytest.mark.slow
def test_corrupt_newest_checkpoint_falls_back_with_a_warning(tmp_path: Path, lm_run_of_9_steps: Path) -> None:
    run_dir = copy_of(lm_run_of_9_steps, tmp_path / "run")
    newest = run_dir / "checkpoints" / store.step_dir_name(9) / "state.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    result = run_in_process(["run", *LM, "trainer.max_steps=12", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    assert "does not match the manifest" in result.output
    assert read_summary(run_dir)["resumed_from"].endswith(store.step_dir_name(6))


def logged_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    """``metrics.csv`` as step → the metrics logged at that step (empty cells left out)."""
    rows: dict[int, dict[str, float]] = {}
    with open(run_dir / "metrics.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            values = {name: float(value) for name, value in row.items() if name != "step" and value}
            rows.setdefault(int(row["step"]), {}).update(values)
    return rows


@pytest.mark.slow
def test_retention_keeps_the_newest_the_best_and_the_resumed(tmp_path: Path) -> None:
    """The best are ranked by the validation of their own step; a checkpoint between validations is no candidate.

    Regression: each manifest held the last value of every metric, so the checkpoint right
    after a validation carried that validation's ``val/loss`` and could take a best slot.
    ``mode=max`` ranks the early validations best, where that copy ties with the original.
    """
    run_dir = tmp_path / "run"
    args = [
        *LM,
        "trainer.max_steps=12",
        "checkpoint.every_n_steps=2",
        "checkpoint.keep_last=2",
        "checkpoint.keep_best=2",
        "checkpoint.monitor=val/loss",
        "checkpoint.mode=max",
        "trainer.val_every=4",
        f"hydra.run.dir={run_dir}",
    ]
    trained(args[:-1], run_dir)
    committed, uncommitted = store.scan(str(run_dir / "checkpoints"))
    steps = [c.manifest.step for c in committed]
    logged = logged_rows(run_dir)
    for checkpoint in committed:
        step = checkpoint.manifest.step
        measured = {
            name: value for name, value in logged[step].items() if name in checkpoint.manifest.metrics
        }
        assert checkpoint.manifest.metrics == pytest.approx(measured, rel=1e-4), (  # the CSV rounds
            f"step {step}: only its own step's metrics"
        )
        assert ("val/loss" in checkpoint.manifest.metrics) == (step % 4 == 0), step
    validated = sorted(
        (step for step, row in logged.items() if "val/loss" in row), key=lambda s: logged[s]["val/loss"]
    )
    assert validated and all(step % 4 == 0 for step in validated)
    assert uncommitted == []
    assert steps[-2:] == [10, 12]
    assert set(steps) == {10, 12, *validated[-2:]}
    resumed = store.join(str(run_dir / "checkpoints"), store.step_dir_name(12))
    rerun = run_in_process(
        ["run", *args[:-1], "trainer.max_steps=20", f"hydra.run.dir={run_dir}"], cwd=tmp_path
    )
    assert rerun.returncode == 0, rerun.output[-3000:]
    assert read_summary(run_dir)["resumed_from"] == resumed
    assert Path(resumed, store.MANIFEST).exists(), "the checkpoint a run resumed from is never deleted"


def test_resume_from_a_missing_url_is_a_plan_error(cli_in_process, tmp_path: Path) -> None:
    result = cli_in_process("run", *LM, f"checkpoint.resume={tmp_path}/nowhere/step-000000003")
    assert result.returncode == 2
    assert "checkpoint.resume" in result.output and "not a committed checkpoint" in result.output


def test_resume_refuses_a_checkpoint_of_another_model(
    cli_in_process, tmp_path: Path, lm_run_of_9_steps: Path
) -> None:
    run_dir = copy_of(lm_run_of_9_steps, tmp_path / "run")
    result = cli_in_process(
        "run", *LM, "trainer.max_steps=12", "model.d_model=48", "model.n_heads=2", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 2, result.output[-2000:]
    assert "was saved by a job with a different model" in result.output
    # the run dir's config.yaml saved the checkpoint: the message names what changed
    assert "different model: model.d_model 32 -> 48" in result.output
    assert "checkpoint.resume=never" in result.output


def test_resume_refuses_another_seed_optimizer_or_corpus_and_resumes_the_same(
    cli_in_process, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus.txt"
    text = "a small corpus, read again before every resume. " * 1000
    corpus.write_text(text)
    run_dir = tmp_path / "run"
    args = [*LM, f"data.path={corpus}", "trainer.val_every=null"]
    trained([*args, "trainer.max_steps=3"], run_dir)
    again = [*args, "trainer.max_steps=6", "monitor.progress=off", f"hydra.run.dir={run_dir}"]
    for changed, named in [
        ("trainer.seed=7", "different seed (trainer.seed)"),  # it orders the samples the data position counts
        ("optim=sgd", "different optimizer (optim)"),  # the saved state is AdamW's
    ]:
        result = cli_in_process("run", *again, changed)
        assert result.returncode == 2, result.output[-2000:]
        assert named in result.output and "checkpoint.resume=never" in result.output
    corpus.write_text(text.replace("small", "SMALL"))  # the same size: sizes and names alone would not tell
    result = cli_in_process("run", *again)
    assert result.returncode == 2, result.output[-2000:]
    assert "different data content" in result.output
    corpus.write_text(text)
    result = cli_in_process("run", *again)
    assert result.returncode == 0, result.output[-3000:]
    assert read_summary(run_dir)["resumed_from"].endswith(store.step_dir_name(3))
    # The same corpus elsewhere (another disk, another machine): its content, not its path, counts.
    moved = tmp_path / "elsewhere" / "copy.txt"
    moved.parent.mkdir()
    moved.write_text(text)
    result = cli_in_process("run", *again[:-1], "trainer.max_steps=8", f"data.path={moved}", again[-1])
    assert result.returncode == 0, result.output[-3000:]
    assert read_summary(run_dir)["resumed_from"].endswith(store.step_dir_name(6))


def test_resume_refuses_a_checkpoint_of_another_strategy_format(
    cli_in_process, tmp_path: Path, lm_run_of_9_steps: Path
) -> None:
    run_dir = copy_of(lm_run_of_9_steps, tmp_path / "run")
    result = cli_in_process("run", *LM, "trainer.max_steps=12", "strategy=fsdp", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2, result.output[-2000:]
    assert "is a full checkpoint, but strategy=fsdp loads sharded (FSDP) ones" in result.output


class Payload:
    """Something that is not a tensor: loading it would run arbitrary code."""


def test_a_checkpoint_carrying_pickled_code_is_refused(
    cli_in_process, tmp_path: Path, lm_run_of_9_steps: Path
) -> None:
    good = lm_run_of_9_steps / "checkpoints" / store.step_dir_name(9)  # read only
    evil = tmp_path / "evil" / store.step_dir_name(9)
    shutil.copytree(good, evil)
    state = torch.load(evil / "state.pt", weights_only=True)
    state["payload"] = Payload()
    torch.save(state, evil / "state.pt")
    store.commit(str(evil), store.read_manifest(str(good)))
    result = cli_in_process(
        "run",
        *LM,
        "trainer.max_steps=12",
        f"checkpoint.resume={evil}",
        f"hydra.run.dir={tmp_path / 'victim'}",
    )
    # Refused in the driver (here, through the console entry) before any training process starts (tests/test_security.py drives more loaders).
    assert result.returncode == 2, result.output[-3000:]
    assert "refusing to load" in result.output and "Traceback" not in result.output


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")  # with the async-save and security tests, which share fsdp_sync_run
def test_fsdp_save_on_two_resume_on_two_and_load_on_one(
    fsdp_sync_run: Path, fsdp_resumed_on_two: dict[str, Path], tmp_path: Path
) -> None:
    committed, _ = store.scan(str(fsdp_sync_run / "checkpoints"))  # saved by 2 processes at steps 4 and 8
    assert committed[-1].manifest.sharded and committed[-1].manifest.world_size == 2
    assert any(p.name.endswith(".distcp") for p in Path(committed[-1].url, "dcp").iterdir())
    exported = checkpoint_weights(committed[-1].url)
    final = load_file(str(fsdp_sync_run / "model.safetensors"))
    assert sorted(exported) == sorted(final)
    for name, tensor in final.items():
        torch.testing.assert_close(exported[name], tensor)
    # Resumed on two processes (conftest's fsdp_resumed_on_two: a copy of those checkpoints, to step 12).
    assert read_summary(fsdp_resumed_on_two["run"])["resumed_from"].endswith(store.step_dir_name(8))
    ckpt = tmp_path / "ckpt"
    shutil.copytree(fsdp_resumed_on_two["checkpoints"], ckpt)
    single = run_in_process(
        [
            "run",
            *FSDP_LM,
            f"checkpoint.dir={ckpt}",
            "trainer.devices=1",
            "data.batch_size=16",
            "trainer.max_steps=16",
            f"hydra.run.dir={tmp_path / 'c'}",
        ],
        cwd=tmp_path,
    )
    assert single.returncode == 0, single.output[-3000:]
    summary = read_summary(tmp_path / "c")
    assert summary["resumed_from"].endswith(store.step_dir_name(12)) and summary["world_size"] == 1
    out = export_checkpoint(store.join(str(ckpt), store.step_dir_name(16)), tmp_path / "model.safetensors")
    assert set(load_file(str(out))) == set(final)


@pytest.fixture
def s3_server(monkeypatch: pytest.MonkeyPatch):
    """moto's standalone S3 server on loopback, and the environment that points s3fs at it.

    Subprocesses get it through the environment (fsspec reads ``FSSPEC_S3_*`` at import);
    this process through fsspec's config.
    """
    import fsspec

    with moto_s3_server() as env:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"]})
        import s3fs

        fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"])
        fs.mkdir("blocks-test")
        yield env, fs


@pytest.mark.slow
def test_s3_checkpoints_save_retain_resume_and_shard(tmp_path: Path, s3_server) -> None:
    _, fs = s3_server
    url = "s3://blocks-test/run1"
    args = [*LM, "trainer.max_steps=9", f"checkpoint.dir={url}", "checkpoint.keep_last=2"]
    # Every run trains from here, where s3_server pointed fsspec at the server as well (and the
    # environment of the FSDP run's workers).
    first = run_in_process(["run", *args, f"hydra.run.dir={tmp_path / 'a'}"], cwd=tmp_path)
    assert first.returncode == 0, first.output[-3000:]
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("blocks-test/run1")) == [
        "step-000000006",
        "step-000000009",
    ]
    manifest = json.loads(fs.cat_file("blocks-test/run1/step-000000009/MANIFEST.json"))
    assert manifest["files"]["state.pt"]["size"] == fs.size("blocks-test/run1/step-000000009/state.pt")
    second = run_in_process(
        ["run", *LM, "trainer.max_steps=12", f"checkpoint.dir={url}", f"hydra.run.dir={tmp_path / 'b'}"],
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.output[-3000:]
    assert read_summary(tmp_path / "b")["resumed_from"] == f"{url}/step-000000009"
    sharded = run_in_process(
        [
            "run",
            "recipe=tiny_lm",
            "trainer.max_steps=4",
            "trainer.val_every=null",
            "strategy=fsdp",
            "trainer.devices=2",
            "data.batch_size=8",
            "checkpoint.every_n_steps=2",
            "checkpoint.dir=s3://blocks-test/fsdp",
            f"hydra.run.dir={tmp_path / 'c'}",
        ],
        cwd=tmp_path,
    )
    assert sharded.returncode == 0, sharded.output[-3000:]
    assert any(p.endswith(".distcp") for p in fs.ls("blocks-test/fsdp/step-000000004/dcp"))
    assert store.read_manifest("s3://blocks-test/fsdp/step-000000004").sharded


def test_a_resume_with_another_accumulation_keeps_counting_the_same_data_position(tmp_path: Path) -> None:
    """The same global batch, resumed in another number of micro-batches a step (1 -> 2 and 2 -> 1).

    Lightning restores its batch counters in the saving run's micro-batches: the resumed run
    recorded 15 steps done at step 20 (1 -> 2) or 30 (2 -> 1), so a later resume repeated or
    skipped data. Now each resumed run's checkpoint at step 10 says 10 steps done and holds the
    weights the uninterrupted run has there.
    """
    base = ["recipe=blobs", "checkpoint.every_n_steps=5", "trainer.val_every=null", "monitor.progress=off"]
    split = {1: ["data.batch_size=32", "optim.accumulate=1"], 2: ["data.batch_size=16", "optim.accumulate=2"]}

    def run(name: str, accumulate: int, *extra: str) -> Path:
        run_dir = tmp_path / name
        args = ["run", *base, *split[accumulate], "trainer.max_steps=10", *extra, f"hydra.run.dir={run_dir}"]
        result = run_in_process(args, cwd=tmp_path)
        assert result.returncode == 0, result.output[-3000:]
        return run_dir / "checkpoints"

    def saved(checkpoints: Path) -> tuple[dict, dict]:
        state = torch.load(checkpoints / store.step_dir_name(10) / "state.pt", weights_only=True)
        (loader,) = state["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        return loader, state["state_dict"]

    whole = {accumulate: run(f"whole{accumulate}", accumulate) for accumulate in split}
    for before, after in ((1, 2), (2, 1)):
        resumed = run(
            f"{before}to{after}", after, f"checkpoint.resume={whole[before] / store.step_dir_name(5)}"
        )
        loader, weights = saved(resumed)
        assert loader["steps_done"] == 10
        assert loader["accumulate"] == after
        _, reference = saved(whole[after])
        for name, tensor in reference.items():
            torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-5)


def test_a_resume_trains_on_with_the_changed_optimizer_settings(tmp_path: Path) -> None:
    """A run extended from 10 to 20 steps with another ``optim.lr`` and weight decay follows them from step 11.

    Regression: the checkpoint's optimizer and scheduler state brought back the saving run's LR,
    weight decay and base LRs, so the changed settings were ignored (the LR stayed 0.001's
    schedule), and step 11 used the old schedule's last LR. Now every resumed step logs the LR
    the new 20-step schedule gives (what an uninterrupted run logs), and the final checkpoint
    holds the new settings, the no-decay group still undecayed.
    """
    run_dir = tmp_path / "run"
    args = [
        "recipe=blobs",
        "optim=adamw",
        "optim.schedule=cosine",
        "optim.warmup_steps=0",
        "optim.min_lr_ratio=0.1",
    ]
    args += [
        "checkpoint.every_n_steps=10",
        "trainer.val_every=null",
        "monitor.log_every_n_steps=1",
        "monitor.progress=off",
    ]
    trained([*args, "trainer.max_steps=10", "optim.lr=0.001", "optim.weight_decay=0.01"], run_dir)
    extended = [
        *args,
        "trainer.max_steps=20",
        "optim.lr=0.01",
        "optim.weight_decay=0.1",
        f"hydra.run.dir={run_dir}",
    ]
    result = run_in_process(["run", *extended], cwd=tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    logged = {step: row["lr"] for step, row in logged_rows(run_dir).items() if step > 10}
    schedule = {"warmup_steps": 0, "total_steps": 20, "schedule": "cosine", "min_lr_ratio": 0.1}
    expected = {step: 0.01 * lr_factor(step - 1, **schedule) for step in range(11, 21)}
    assert logged == pytest.approx(expected, rel=1e-3)  # the CSV rounds
    state = torch.load(run_dir / "checkpoints" / store.step_dir_name(20) / "state.pt", weights_only=True)
    (optimizer,) = state["optimizer_states"]
    assert [group["weight_decay"] for group in optimizer["param_groups"]] == [0.1, 0.0]
    assert state["lr_schedulers"][0]["base_lrs"] == [0.01, 0.01]


def test_an_extended_run_trains_what_an_uninterrupted_one_does_from_an_epoch_boundary_or_mid_epoch(
    tmp_path: Path,
) -> None:
    """A finished run extended (``max_epochs`` 1 to 2, ``max_steps`` 3 to 12) reaches the uninterrupted run's state.

    Regression: the final checkpoint is saved after Lightning counted the last epoch finished,
    with the loader still in it. Restored so, the next epoch ended after the steps the saved one
    had left (one step after an epoch boundary), and a stop in the middle of an epoch lost the
    rest of it: the extended runs trained on other batches than an uninterrupted run.
    """
    args = [
        "recipe=blobs",
        "data.samples=60",
        "data.batch_size=8",  # 54 training samples: 6 steps an epoch
        "optim.schedule=constant",
        "optim.warmup_steps=0",
        "monitor.log_every_n_steps=1",
        "monitor.progress=off",
    ]
    by_epochs, by_steps = ["trainer.max_steps=null"], ["trainer.max_epochs=null"]
    whole = trained([*args, *by_epochs, "trainer.max_epochs=2"], tmp_path / "whole")
    expected = {step: row["train/loss"] for step, row in logged_rows(tmp_path / "whole").items()}
    for name, first, then in [
        ("boundary", "trainer.max_epochs=1", "trainer.max_epochs=2"),
        ("mid-epoch", "trainer.max_steps=3", "trainer.max_steps=12"),
    ]:
        limit = by_epochs if name == "boundary" else by_steps
        trained([*args, *limit, first], tmp_path / name)
        extended = trained([*args, *limit, then], tmp_path / name)
        assert extended["resumed_from"], name
        assert extended["state_digest"] == whole["state_digest"], name
        logged = {step: row["train/loss"] for step, row in logged_rows(tmp_path / name).items()}
        assert logged == expected, name


def test_a_resumed_run_loads_each_batch_with_the_augmentations_the_uninterrupted_run_drew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset's random draws (augmentations) are a function of the batch's place in the data.

    Regression: without loader workers, the checkpoint kept the generator's state after
    Lightning had loaded the next batch, so the resumed run drew each batch's augmentations
    from the batch after's (and the model's dropout from other numbers); with workers, the
    resumed workers started again from their seeds. Either way the resumed run trained on
    other samples than the uninterrupted one. With the draws seeded per batch, another
    ``data.num_workers`` trains the same run too (the model draws from torch only), and
    ``blocks eval`` scores the validation samples the run's validation drew.
    """
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    args = [
        "recipe=blobs",
        "model.dropout=0.1",
        "optim.schedule=constant",
        "optim.warmup_steps=0",
        "data=lightning_data",
        "data.target=tests.legacy_team.AugmentingDM",
        "data.num_features=8",
        "data.num_classes=3",
        "data.train_samples=192",
        "data.val_samples=64",
        "data.batch_size=32",
        "trainer.max_epochs=null",
        "checkpoint.every_n_steps=4",
        "checkpoint.keep_last=3",
        "monitor.log_every_n_steps=1",
        "monitor.progress=off",
    ]
    whole = trained([*args, "trainer.max_steps=9"], tmp_path / "whole")
    expected = {step: row["train/loss"] for step, row in logged_rows(tmp_path / "whole").items() if step > 4}
    saved_mid_run = tmp_path / "whole" / "checkpoints" / store.step_dir_name(4)
    for workers in (0, 2):
        run_dir = tmp_path / f"resumed-with-{workers}-workers"
        resumed = trained(
            [
                *args,
                f"data.num_workers={workers}",
                "trainer.max_steps=9",
                f"checkpoint.resume={saved_mid_run}",
            ],
            run_dir,
        )
        assert resumed["resumed_from"] == str(saved_mid_run), workers
        logged = {step: row["train/loss"] for step, row in logged_rows(run_dir).items()}
        assert logged == expected, f"data.num_workers={workers}"
        assert resumed["state_digest"] == whole["state_digest"], f"data.num_workers={workers}"
        assert resumed["metrics"]["val/loss"] == whole["metrics"]["val/loss"], "validation draws alike"
    from blocks.launch.evaluate import evaluate

    # Regression: eval drew the validation set's augmentations anew, scoring other samples.
    assert evaluate(str(tmp_path / "whole"))["val/loss"] == pytest.approx(
        whole["metrics"]["val/loss"], rel=1e-6
    )


@pytest.mark.parametrize(
    "health",
    [[], ["optim.lr=1e8", "optim.warmup_steps=0", "monitor.on_nonfinite=skip"]],
    ids=["healthy", "steps-skipped-on-the-device"],
)
def test_a_resume_between_logged_steps_logs_the_same_training_loss(tmp_path: Path, health: list[str]) -> None:
    """The loss is averaged over the counted steps since the last logged one; a checkpoint between
    two of them (a save every 5 steps, logging every 10) now carries the open window, so the
    resumed run logs at step 10 the mean the uninterrupted run logged (it averaged steps 6-10
    only). Steps fused AdamW skipped on the device are counted out of the saved window too."""
    args = ["recipe=blobs", "checkpoint.every_n_steps=5", "checkpoint.keep_last=10", "trainer.val_every=null"]
    args += ["monitor.log_every_n_steps=10", "monitor.progress=off", "trainer.max_steps=10", *health]

    def logged_losses(run_dir: Path) -> dict[int, float]:
        with (run_dir / "metrics.csv").open() as fh:
            return {
                int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(fh) if row["train/loss"]
            }

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    for run_dir, extra in (
        (whole, []),
        (resumed, [f"checkpoint.resume={whole / 'checkpoints' / store.step_dir_name(5)}"]),
    ):
        result = run_in_process(["run", *args, *extra, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        assert result.returncode == 0, result.output[-3000:]
    assert logged_losses(resumed)[10] == pytest.approx(logged_losses(whole)[10], rel=1e-6)
