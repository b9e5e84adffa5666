"""Checkpoint faults: damaged manifests, corrupt newest checkpoints, retention, unusable resumes, storage."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from blocks.checkpoint import store
from blocks.launch import driver
from blocks.spec.errors import BlocksError
from tests.conftest import REPO, call_in_fresh_process, run_in_process, spawned

pytestmark = pytest.mark.timeout(600)

BLOBS = [
    "recipe=blobs",
    "monitor.progress=off",
    "monitor.log_every_n_steps=1",
    "checkpoint.every_n_steps=3",
    "checkpoint.keep_last=3",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 9-step run with committed checkpoints at steps 3, 6 and 9."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    assert driver.run([*BLOBS, "trainer.max_steps=9"], run_dir).status == "completed"
    return run_dir


@pytest.fixture
def run_dir(trained: Path, tmp_path: Path) -> Path:
    """A private copy of the trained run dir."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / store.step_dir_name(step)


def corrupt(run_dir: Path, step: int) -> None:
    state = step_dir(run_dir, step) / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))


def edit_manifest(run_dir: Path, step: int, edit) -> None:
    path = step_dir(run_dir, step) / store.MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


MANIFEST_DAMAGE = {
    "files-a-list": lambda m: m.update(files=[]),
    "files-empty": lambda m: m.update(files={}),
    "step-a-string": lambda m: m.update(step="9"),
    "step-null": lambda m: m.update(step=None),
    "entry-without-size": lambda m: m["files"]["state.pt"].pop("size"),
    "digest-not-hex": lambda m: m["files"]["state.pt"].update({store.HASH: 12}),
    "step-not-its-directorys": lambda m: m.update(step=30),  # resumed "from step 30", trained on from 9
}


@pytest.mark.parametrize("damage", list(MANIFEST_DAMAGE))
def test_a_damaged_manifest_is_a_corrupt_checkpoint(run_dir: Path, damage: str) -> None:
    edit_manifest(run_dir, 9, MANIFEST_DAMAGE[damage])
    with pytest.raises(store.CheckpointError, match=r"damaged MANIFEST\.json"):
        store.read_manifest(str(step_dir(run_dir, 9)))
    found = store.newest_valid(str(run_dir / "checkpoints"))
    assert found is not None and found.manifest.step == 6


def test_files_emptied_and_state_damaged_falls_back_instead_of_crashing(run_dir: Path) -> None:
    """``files: {}`` used to turn verification off; the damaged state.pt then crashed torch.load."""
    edit_manifest(run_dir, 9, MANIFEST_DAMAGE["files-empty"])
    (step_dir(run_dir, 9) / "state.pt").write_bytes(b"\xff\xfe not a checkpoint")
    summary = driver.run([*BLOBS, "trainer.max_steps=12"], run_dir)
    assert summary.status == "completed" and summary.global_step == 12
    assert summary.resumed_from == str(step_dir(run_dir, 6))


def test_resume_is_announced(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = driver.run([*BLOBS, "trainer.max_steps=12"], run_dir)
    assert summary.resumed_from == str(step_dir(run_dir, 9))
    assert f"resuming from step 9 of {step_dir(run_dir, 9)}" in capsys.readouterr().out


def test_every_checkpoint_corrupt_fails_instead_of_training_from_scratch(run_dir: Path) -> None:
    for step in (3, 6, 9):
        corrupt(run_dir, step)
    with pytest.raises(BlocksError) as refused:
        driver.run([*BLOBS, "trainer.max_steps=12"], run_dir)
    problem = refused.value.problems[0]
    assert problem.key == "checkpoint.resume"
    assert "does not match the manifest" in problem.message
    assert "checkpoint.resume=never" in problem.fix
    summary = driver.run([*BLOBS, "trainer.max_steps=4", "checkpoint.resume=never"], run_dir)
    assert summary.status == "completed" and not summary.resumed_from


def test_every_checkpoint_corrupt_exits_non_zero_on_the_cli(run_dir: Path, tmp_path: Path) -> None:
    for step in (3, 6, 9):
        corrupt(run_dir, step)
    result = run_in_process(["run", *BLOBS, "trainer.max_steps=12", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.output
    assert "checkpoint.resume=never" in result.output


def test_retention_does_not_count_corrupt_newer_checkpoints(run_dir: Path) -> None:
    """With the two newest corrupt, new checkpoints survive their own retention, and a second rerun resumes."""
    corrupt(run_dir, 6)
    corrupt(run_dir, 9)
    args = [*BLOBS, "checkpoint.every_n_steps=1", "checkpoint.keep_last=2"]
    summary = driver.run([*args, "trainer.max_steps=5"], run_dir)
    assert summary.resumed_from == str(step_dir(run_dir, 3))
    committed, _ = store.scan(str(run_dir / "checkpoints"))
    steps = {c.manifest.step for c in committed}
    assert {4, 5} <= steps, f"the new checkpoints were deleted by retention: {sorted(steps)}"
    store.verify(str(step_dir(run_dir, 5)))
    again = driver.run([*args, "trainer.max_steps=7"], run_dir)
    assert again.resumed_from == str(step_dir(run_dir, 5))
    committed, _ = store.scan(str(run_dir / "checkpoints"))
    assert [c.manifest.step for c in committed] == [5, 6, 7, 9], "the corrupt 9 goes once a save passes it"


def made(step: int, metrics: dict[str, float] | None = None) -> store.Committed:
    """A committed checkpoint of *step* as retention sees it (its manifest only)."""
    manifest = store.Manifest(
        step=step,
        epoch=0,
        world_size=1,
        sharded=False,
        global_batch=1,
        block_digests={},
        metrics=metrics or {},
    )
    return store.Committed(f"mem/step-{step}", manifest)


def test_to_delete_leaves_stale_checkpoints_out_of_the_count() -> None:
    committed = [made(3), made(4), made(6), made(9)]
    stale = ["mem/step-6", "mem/step-9"]
    assert store.to_delete(committed, keep_last=2, stale=stale) == []
    assert store.to_delete([*committed, made(7)], keep_last=2, stale=stale) == ["mem/step-3", "mem/step-6"]


@pytest.mark.parametrize(
    ("mode", "values", "best"),
    [("min", [0.5, math.nan, 0.3, 0.9], 3), ("max", [0.9, math.nan, 0.95, 0.2], 3)],
)
def test_keep_best_ranks_no_checkpoint_by_a_nan_value(mode: str, values: list[float], best: int) -> None:
    """Regression: the checkpoints were sorted by their raw values, and every comparison with NaN is
    false, so a NaN between them left the order unsorted: the best checkpoint was deleted and a worse
    (or the NaN) one kept."""
    committed = [made(step, {"val/loss": value}) for step, value in enumerate(values, start=1)]
    deleted = store.to_delete(committed, keep_last=1, keep_best=1, monitor="val/loss", mode=mode)
    kept = {c.url for c in committed} - set(deleted)
    assert kept == {f"mem/step-{best}", f"mem/step-{len(values)}"}


def test_a_users_step_directory_is_not_deleted(run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    notes = run_dir / "checkpoints" / "step-000000005" / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("mine")
    with caplog.at_level(logging.WARNING):
        assert driver.run([*BLOBS, "trainer.max_steps=12"], run_dir).status == "completed"
    assert notes.read_text() == "mine"
    assert "not written by blocks" in caplog.text


def test_a_step_directory_that_is_a_link_is_never_resumed_from_or_deleted_through(
    run_dir: Path, tmp_path: Path
) -> None:
    """A ``step-<N>`` link to a copy of a checkpoint elsewhere was listed as committed: retention
    deleted every file of its target, the files its manifest did not list included."""
    outside = tmp_path / "outside"
    shutil.copytree(step_dir(run_dir, 3), outside)
    (outside / "notes.txt").write_text("mine")
    kept = sorted(p.name for p in outside.iterdir())
    linked = step_dir(run_dir, 1)
    linked.symlink_to(outside)
    assert (
        driver.run([*BLOBS, "trainer.max_steps=12", "checkpoint.keep_last=1"], run_dir).status == "completed"
    )
    assert linked.is_symlink() and sorted(p.name for p in outside.iterdir()) == kept
    assert (
        not store.is_ours(str(linked)) and str(linked) in store.list_dir(str(run_dir / "checkpoints")).foreign
    )
    with pytest.raises(store.CheckpointError, match="exists but was not written by blocks"):
        store.replace_ours(str(linked))  # a save of step 1 refuses it instead of writing through it


def test_blocks_own_unfinished_save_is_still_cleaned(run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Also an empty step directory: a save killed before it marked its directory was reported as
    a step directory blocks did not write."""
    leftover = step_dir(run_dir, 11)
    shutil.copytree(step_dir(run_dir, 9), leftover)
    (leftover / store.MANIFEST).unlink()
    assert (leftover / store.MARKER).exists(), "blocks marks every checkpoint directory it creates"
    killed_before_its_marker = step_dir(run_dir, 12)
    killed_before_its_marker.mkdir()
    users = run_dir / "checkpoints" / "step-99"  # empty too, but not a name blocks gives its directories
    users.mkdir()
    with caplog.at_level(logging.WARNING):
        assert driver.run([*BLOBS, "trainer.max_steps=10"], run_dir).status == "completed"
    assert not leftover.exists() and not killed_before_its_marker.exists()
    assert users.is_dir() and "step-99 looks like a checkpoint but was not written by blocks" in caplog.text


def test_rollback_falls_back_past_a_corrupt_checkpoint(tmp_path: Path) -> None:
    """``monitor.on_nonfinite=rollback`` with the newest checkpoint corrupt restores the older one."""
    run_dir = tmp_path / "run"
    args = [*BLOBS, "optim.lr=1e8", "optim.warmup_steps=0", "checkpoint.every_n_steps=2"]
    assert (
        driver.run([*args, "trainer.max_steps=4", "monitor.on_nonfinite=skip"], run_dir).status == "completed"
    )
    corrupt(run_dir, 4)
    # Resumes from step 2 (falling back past 4); its non-finite steps roll back while the corrupt 4 is the newest.
    summary = driver.run(
        [*args, "trainer.max_steps=4", "checkpoint.every_n_steps=0", "monitor.on_nonfinite=rollback"], run_dir
    )
    assert summary.resumed_from == str(step_dir(run_dir, 2))
    assert summary.status == "completed"
    assert summary.metrics["health/rollbacks"] >= 1


def test_rollback_never_restores_an_earlier_runs_checkpoint(tmp_path: Path) -> None:
    """A run started with ``checkpoint.resume=never`` beside an earlier run's checkpoints rolled
    back to the earlier run's newest weights before it had saved any of its own. Until it saves,
    it has nothing to roll back to: its bad steps are skipped instead."""
    run_dir = tmp_path / "run"
    assert (
        driver.run([*BLOBS, "trainer.max_steps=4", "checkpoint.every_n_steps=2"], run_dir).status
        == "completed"
    )
    diverging = [*BLOBS, "optim.lr=1e8", "optim.warmup_steps=0", "trainer.max_steps=4"]
    summary = driver.run(
        [
            *diverging,
            "checkpoint.resume=never",
            "checkpoint.every_n_steps=0",
            "monitor.on_nonfinite=rollback",
        ],
        run_dir,
    )
    assert summary.status == "completed" and summary.resumed_from is None
    assert "health/rollbacks" not in summary.metrics, summary.metrics
    assert summary.metrics["health/skipped_steps"] >= 1


def test_a_rerun_that_saves_the_same_checkpoints_keeps_its_own(tmp_path: Path) -> None:
    """Reruns train bit-identically: a rerun under ``resume=never`` saves checkpoints of the same steps,
    files and sizes as the earlier run's, with the same weights (only the seconds of training the
    recorder carries in ``state.pt`` differ), so the id of the job that saved each one tells them
    apart; and the id of each ``blocks run`` is its own, so a third identical run does not take the
    second one's either. Another run's damaged checkpoint is no reason to refuse a restart."""
    from blocks.checkpoint.resume import read_start, record_start

    run_dir, checkpoints = tmp_path / "run", str(tmp_path / "run" / "checkpoints")
    args = [*BLOBS, "trainer.max_steps=4", "checkpoint.every_n_steps=2", "checkpoint.keep_last=5"]
    first = driver.run(args, run_dir)
    assert first.status == "completed"
    earlier = {c.manifest.step: c.manifest for c in store.scan(checkpoints)[0]}
    again = driver.run([*args, "checkpoint.resume=never"], run_dir)
    assert again.status == "completed" and again.state_digest == first.state_digest
    second = read_start(run_dir)
    assert second.resumed_from is None and second.lineage == [] and len(second.foreign) == len(earlier) == 2
    rerun = {c.manifest.step: c.manifest for c in store.scan(checkpoints)[0]}

    def sized(manifests: dict[int, store.Manifest]) -> dict[int, dict[str, int]]:
        return {step: {name: f["size"] for name, f in m.files.items()} for step, m in manifests.items()}

    assert sized(rerun) == sized(earlier)
    assert {s: m.block_digests for s, m in rerun.items()} == {s: m.block_digests for s, m in earlier.items()}
    assert all(m.job == second.job for m in rerun.values())
    found = store.newest_valid(checkpoints, second.candidates())
    assert found is not None and found.manifest.step == 4

    damaged = tmp_path / "run" / "checkpoints" / store.step_dir_name(6)
    shutil.copytree(tmp_path / "run" / "checkpoints" / store.step_dir_name(4), damaged)
    (damaged / store.MANIFEST).write_text("{not json")
    third = record_start(run_dir, checkpoints, None, (run_dir / "config.yaml").read_text())
    assert third.job != second.job
    assert store.find_valid(checkpoints, third.candidates()) == (None, [])


def test_auto_continues_the_run_dirs_last_job_not_the_earlier_run_it_started_over_from(
    run_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job started with ``resume=never`` beside an earlier run's newer checkpoints (steps 6, 9),
    then rerun with ``resume=auto`` (what an interrupted one's summary says to do), resumed the
    earlier run's step 9 and reported ``completed`` at step 9 though max_steps was 6; and the
    driver's summary for a job whose workers died took step 9 for that job's progress. Now auto
    continues the job's own step 4, another job's newest beside it is an error naming both, and
    a checkpoint past max_steps is refused."""
    from blocks.launch.run_dir import load_plan

    every_2 = [*BLOBS, "checkpoint.every_n_steps=2"]
    fresh = driver.run([*every_2, "trainer.max_steps=4", "checkpoint.resume=never"], run_dir)
    assert fresh.status == "completed" and fresh.resumed_from is None
    assert driver.trained_steps(run_dir, load_plan(run_dir)) == 4, "the job's own newest, not the earlier 9"

    with caplog.at_level(logging.WARNING):
        summary = driver.run([*every_2, "trainer.max_steps=6"], run_dir)
    assert summary.resumed_from == str(step_dir(run_dir, 4))
    assert (summary.status, summary.global_step) == ("completed", 6)
    assert "not step 9" in caplog.text

    with pytest.raises(BlocksError) as refused:
        driver.run([*every_2, "trainer.max_steps=6", f"checkpoint.resume={step_dir(run_dir, 9)}"], run_dir)
    (problem,) = refused.value.problems
    assert problem.key == "checkpoint.resume" and "past this run's last step 6" in problem.message
    assert "raise trainer.max_steps" in problem.fix and "checkpoint.resume=never" in problem.fix

    shutil.copytree(step_dir(run_dir, 6), step_dir(run_dir, 12))  # another job's, saved since
    edit_manifest(run_dir, 12, lambda m: m.update(step=12, job="another job"))
    with pytest.raises(BlocksError) as ambiguous:
        driver.run([*every_2, "trainer.max_steps=20"], run_dir)
    (problem,) = ambiguous.value.problems
    assert problem.key == "checkpoint.resume" and "ambiguous" in problem.message
    assert f"checkpoint.resume={step_dir(run_dir, 6)}" in problem.fix
    assert f"checkpoint.resume={step_dir(run_dir, 12)}" in problem.fix


def _flip_tensor_bytes(shard: Path, offset: int, length: int) -> None:
    """Damage the middle of one tensor's record in a DCP shard file (its raw data, not its zip header)."""
    data = bytearray(shard.read_bytes())
    for index in range(offset + length // 2, offset + length // 2 + 16):
        data[index] ^= 0x55
    shard.write_bytes(bytes(data))


SHARDS_DIR, SHARDS_METADATA = "dcp", "dcp/.metadata"


@pytest.mark.xdist_group("torchrun")  # shares fsdp_sync_run with the other FSDP checkpoint tests
def test_a_shard_the_manifest_does_not_list_is_never_read_unverified(
    fsdp_sync_run: Path, tmp_path: Path
) -> None:
    """A sharded manifest that lost a shard's entry is damage: the shard is refused, not loaded as weights.

    Before, only ``state.pt`` had to be listed: a damaged shard whose entry was gone loaded
    silently as different weights, and a resume picked that checkpoint as the newest valid one.
    """
    from blocks.checkpoint.export import checkpoint_weights
    from blocks.checkpoint.safe_dcp import load_metadata

    directory = tmp_path / "checkpoints"
    shutil.copytree(fsdp_sync_run / "checkpoints", directory)
    newest = directory / store.step_dir_name(8)
    metadata = load_metadata((newest / SHARDS_METADATA).open("rb"), str(newest))
    shard, record = max(
        (
            (info.relative_path, info)
            for index, info in metadata.storage_data.items()
            if index.fqn.startswith("model.")
        ),
        key=lambda found: found[1].length,
    )
    manifest = json.loads((newest / store.MANIFEST).read_text())
    del manifest["files"][f"{SHARDS_DIR}/{shard}"]
    (newest / store.MANIFEST).write_text(json.dumps(manifest))
    _flip_tensor_bytes(newest / SHARDS_DIR / shard, record.offset, record.length)

    with pytest.raises(store.CheckpointError, match=f"{SHARDS_DIR}/{shard} not in the manifest"):
        checkpoint_weights(str(newest))
    found, skipped = store.find_valid(str(directory))
    assert found is not None and found.manifest.step == 4, (
        "a resume falls back to the last checkpoint it can verify"
    )
    assert any(shard in reason for reason in skipped)


@pytest.mark.xdist_group("torchrun")
def test_a_sharded_manifest_must_list_the_shards_metadata(fsdp_sync_run: Path, tmp_path: Path) -> None:
    """Without ``dcp/.metadata`` in the manifest, the file that says where every shard lies would go unchecked."""
    checkpoint = tmp_path / "step"
    shutil.copytree(fsdp_sync_run / "checkpoints" / store.step_dir_name(8), checkpoint)
    manifest = json.loads((checkpoint / store.MANIFEST).read_text())
    del manifest["files"][SHARDS_METADATA]
    (checkpoint / store.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(store.CheckpointError, match=f"does not list {SHARDS_METADATA}"):
        store.verify(str(checkpoint))


@pytest.mark.xdist_group("torchrun")
def test_shards_metadata_pointing_outside_the_manifest_is_refused(
    fsdp_sync_run: Path, tmp_path: Path
) -> None:
    """Metadata naming a file the manifest lists under another name (``dcp/../state.pt``) is refused before DCP reads it."""
    import pickle

    from blocks.checkpoint.export import checkpoint_weights
    from blocks.checkpoint.safe_dcp import load_metadata

    checkpoint = tmp_path / "step"
    shutil.copytree(fsdp_sync_run / "checkpoints" / store.step_dir_name(8), checkpoint)
    metadata = load_metadata((checkpoint / SHARDS_METADATA).open("rb"), str(checkpoint))
    index = next(index for index in metadata.storage_data if index.fqn.startswith("model."))
    metadata.storage_data[index].relative_path = "../state.pt"
    (checkpoint / SHARDS_METADATA).write_bytes(pickle.dumps(metadata))
    store.commit(
        str(checkpoint), store.read_manifest(str(checkpoint))
    )  # a writer that committed what it wrote

    with pytest.raises(
        store.CheckpointError, match=r"names dcp/\.\./state\.pt, which the manifest does not list"
    ):
        checkpoint_weights(str(checkpoint))


class _Killed(BaseException):
    """Stands for the SIGKILL that ends a process between two file deletions."""


def _remove_cut_short(url: str, allowed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``store.remove(url)``, ended like a killed process before its deletion number *allowed* + 1."""
    import os

    unlink, remove = os.unlink, os.remove
    deletions = [0]

    def counted(delete: Any) -> Any:
        def deleting(path: Any, *args: Any, **kwargs: Any) -> None:
            if deletions[0] == allowed:
                raise _Killed
            deletions[0] += 1
            delete(path, *args, **kwargs)

        return deleting

    with monkeypatch.context() as patched:
        patched.setattr(os, "unlink", counted(unlink))
        patched.setattr(os, "remove", counted(remove))
        with contextlib.suppress(_Killed):
            store.remove(url)


def test_a_removal_cut_short_leaves_a_directory_the_next_save_replaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed while it replaced a step dir left files without the marker: its restart refused that step.

    The removal is cut short after each number of file deletions in turn: what is left is the
    whole committed checkpoint (nothing deleted yet) or blocks' own unfinished directory, which
    the next save of that step replaces.
    """
    for allowed in range(7):
        url = str(tmp_path / str(allowed) / store.step_dir_name(10))
        store.begin(url)
        for name in ("state.pt", "extra.pt", "optim.pt"):
            (Path(url) / name).write_bytes(b"state")
        manifest = store.Manifest(
            step=10, epoch=0, world_size=1, sharded=False, global_batch=8, block_digests={}
        )
        store.commit(url, manifest)
        _remove_cut_short(url, allowed, monkeypatch)
        if not Path(url).exists():
            continue
        committed = (Path(url) / store.MANIFEST).exists()
        if committed:
            assert allowed == 0, f"cut after {allowed} deletions, the rest still looks committed"
            store.verify(url)
            with pytest.raises(store.CheckpointError, match="already holds a committed checkpoint"):
                store.replace_ours(url)  # a save of its step replaces it only where it is stale
        store.replace_ours(url, stale=committed)  # "exists but was not written by blocks" before
        assert not Path(url).exists()


SIGNAL_AT_SETUP = "trainer.callbacks=[{_target_: tests.lightning_habits.SignalAtSetup}]"
"""SIGTERM while Lightning sets the run up: the run stops at its first step boundary, before training a step."""


def test_a_stop_before_the_first_step_leaves_the_checkpoint_it_resumed_from_alone(run_dir: Path) -> None:
    """A run stopped before its first step (SIGTERM during the load of a big checkpoint) saved "at step 9",
    the step it resumed from: the save deleted the committed step 9 and rewrote it, and a SIGKILL
    during the rewrite (a grace period ending; here while ``BLOCKS_FAULT_SLOW_SAVE`` holds it) left
    no committed checkpoint there. Nothing was trained since: the checkpoint stands as it is."""
    resumed = step_dir(run_dir, 9)
    manifest = (resumed / store.MANIFEST).read_bytes()
    args = [*BLOBS, "trainer.max_steps=12", f"hydra.run.dir={run_dir}", SIGNAL_AT_SETUP]
    env = {**os.environ, "BLOCKS_ALLOW_IMPORTS": "tests", "BLOCKS_FAULT_SLOW_SAVE": "9:600"}
    with spawned(
        [sys.executable, "-m", "blocks", "run", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as job:
        assert job.stdout is not None
        said = []
        for line in job.stdout:
            said.append(line)
            if "BLOCKS_FAULT_SLOW_SAVE" in line:  # re-saving step 9: the grace period ends
                os.killpg(job.pid, signal.SIGKILL)
                break
        job.wait()
    assert (resumed / store.MANIFEST).read_bytes() == manifest, "".join(said)[-3000:]
    summary = driver.run([*BLOBS, "trainer.max_steps=12"], run_dir)
    assert summary.resumed_from == str(resumed)
    assert (summary.status, summary.global_step) == ("completed", 12)


def stop_before_the_first_step_resumed_from_elsewhere(source: str, run_dir: str) -> list[dict[str, str]]:
    """In a fresh process: a run resuming *source* (another run's checkpoint) SIGTERMed before its first
    step, twice; after each, the manifest of every step directory its own checkpoint dir holds."""
    os.environ["BLOCKS_ALLOW_IMPORTS"] = "tests"
    held = []
    for _ in range(2):
        args = [*BLOBS, "trainer.max_steps=12", f"checkpoint.resume={source}", SIGNAL_AT_SETUP]
        with contextlib.suppress(driver.JobFailed):
            driver.run(args, Path(run_dir))
        committed = store.list_dir(str(Path(run_dir) / "checkpoints")).committed
        held.append({Path(c.url).name: c.manifest.to_json() for c in committed})
    return held


def test_a_stop_before_the_first_step_copies_a_checkpoint_resumed_from_elsewhere(
    run_dir: Path, tmp_path: Path
) -> None:
    """Resumed from another run's checkpoint, the save at that step before any training is a copy into the
    run's own checkpoint dir (its position for ``auto``), the source left as it is; stopped again, the
    copy stands (a committed checkpoint of that step is never deleted to save it again)."""
    source = step_dir(run_dir, 9)
    manifest = (source / store.MANIFEST).read_bytes()
    own = tmp_path / "own"
    held = call_in_fresh_process(stop_before_the_first_step_resumed_from_elsewhere, str(source), str(own))
    first, second = held
    assert list(first) == [source.name] and second == first, "copied once, then left as it is"
    assert (source / store.MANIFEST).read_bytes() == manifest
    store.verify(str(own / "checkpoints" / source.name))


def test_auto_refuses_to_start_over_when_the_checkpoints_the_last_job_continued_are_gone(
    run_dir: Path,
) -> None:
    """The run dir's last job resumed from its step 9; with every checkpoint since gone (a rewrite of
    step 9 killed half way did that), ``auto`` trained from step 0 without a word."""
    from blocks.checkpoint.resume import record_start

    checkpoints = run_dir / "checkpoints"
    record_start(run_dir, str(checkpoints), str(step_dir(run_dir, 9)), (run_dir / "config.yaml").read_text())
    for step in (3, 6, 9):
        store.remove(str(step_dir(run_dir, step)))
    with pytest.raises(BlocksError) as refused:
        driver.run([*BLOBS, "trainer.max_steps=12"], run_dir)
    (problem,) = refused.value.problems
    assert problem.key == "checkpoint.resume" and str(step_dir(run_dir, 9)) in problem.message
    assert "checkpoint.resume=never" in problem.fix


def test_a_restart_refuses_to_start_over_when_the_checkpoints_its_job_continued_are_gone(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job resumed from step 9; its checkpoints lost, torchrun's restart of its workers (which load
    whatever the job can call its own, whatever ``resume`` says) trained from step 0 without a word."""
    from blocks.launch.worker import train

    driver.prepare([*BLOBS, "trainer.max_steps=12"], run_dir)  # what the driver writes before torchrun
    for step in (3, 6, 9):
        store.remove(str(step_dir(run_dir, step)))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with pytest.raises(BlocksError) as refused:
        train(run_dir, console=False)
    (problem,) = refused.value.problems
    assert problem.key == "checkpoint.resume" and str(step_dir(run_dir, 9)) in problem.message
    assert "checkpoint.resume=never" in problem.fix
    assert not store.list_dir(str(run_dir / "checkpoints")).committed, "nothing was trained or saved"


def test_a_manifest_killed_as_it_was_written_is_an_unfinished_save(run_dir: Path) -> None:
    """An empty manifest (a commit killed while earlier versions wrote it in place) made its checkpoint
    damaged: the only one, the rerun refused to start, asking to remove it by hand."""
    for step in (3, 6):
        store.remove(str(step_dir(run_dir, step)))
    (step_dir(run_dir, 9) / store.MANIFEST).write_bytes(b"")
    assert store.list_dir(str(run_dir / "checkpoints")).uncommitted == [str(step_dir(run_dir, 9))]
    summary = driver.run([*BLOBS, "trainer.max_steps=3"], run_dir)
    assert (summary.status, summary.resumed_from) == ("completed", None)
    assert not step_dir(run_dir, 9).exists()


def test_the_manifest_is_renamed_into_place_whole(tmp_path: Path) -> None:
    """The manifest was written in place: a kill while writing it left it empty or cut short."""
    url = tmp_path / store.step_dir_name(4)
    store.begin(str(url))
    (url / store.STATE_FILE).write_bytes(b"state")
    (url / store.MANIFEST).write_text("an earlier try's")
    written_in_place = (url / store.MANIFEST).stat().st_ino
    manifest = store.Manifest(step=4, epoch=0, world_size=1, sharded=False, global_batch=8, block_digests={})
    store.commit(str(url), manifest)
    assert (url / store.MANIFEST).stat().st_ino != written_in_place
    assert sorted(p.name for p in url.iterdir()) == sorted([store.MARKER, store.MANIFEST, store.STATE_FILE])
    assert store.verify(str(url)).step == 4


def test_a_users_entry_where_a_sigterm_may_save_is_refused_before_training(run_dir: Path) -> None:
    """A ``step-<N>`` entry between the run's periodic saves was let through: a SIGTERM (or
    ``checkpoint.every_seconds``) saving at step N failed there, losing every step since the last save."""
    (step_dir(run_dir, 11) / "notes.txt").parent.mkdir()
    (step_dir(run_dir, 11) / "notes.txt").write_text("mine")
    with pytest.raises(BlocksError) as refused:
        driver.run([*BLOBS, "trainer.max_steps=12"], run_dir)  # saves every 3 steps
    (problem,) = refused.value.problems
    assert problem.key == "checkpoint.dir" and str(step_dir(run_dir, 11)) in problem.message
    assert "SIGTERM" in problem.message and "move it out of checkpoint.dir" in problem.fix
    assert driver.run([*BLOBS, "trainer.max_steps=10"], run_dir).status == "completed", "past its last step"


def test_a_users_entry_where_the_run_will_save_is_refused_before_training(run_dir: Path) -> None:
    """A ``step-<N>`` entry blocks did not write at a step the run saves at was only warned about: the run
    trained up to that step, then failed to save there."""
    notes = step_dir(run_dir, 12) / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("mine")
    with pytest.raises(BlocksError) as refused:
        driver.run([*BLOBS, "trainer.max_steps=12"], run_dir)
    (problem,) = refused.value.problems
    assert problem.key == "checkpoint.dir" and str(step_dir(run_dir, 12)) in problem.message
    assert "move it out of checkpoint.dir" in problem.fix
    assert notes.read_text() == "mine"
    assert not (run_dir / "checkpoints" / store.step_dir_name(12) / store.MANIFEST).exists()
