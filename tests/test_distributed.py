"""Real multi-process training on CPU with gloo: DDP, FSDP2, sweeps, two nodes, restarts."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from safetensors.torch import load_file

from blocks.core import jobs
from blocks.launch import driver, worker
from blocks.launch.evaluate import evaluate
from blocks.launch.worker import vanished_ranks
from blocks.runtime.trainer import build_run
from tests.conftest import (
    REPO,
    call_in_fresh_process,
    free_port,
    read_summary,
    run_cli,
    run_in_process,
    spawned,
)

pytestmark = pytest.mark.timeout(600)

LM = [
    "recipe=tiny_lm",
    "trainer.max_steps=8",
    "trainer.val_every=null",
    "monitor.progress=off",
    "optim.warmup_steps=2",
    "data.val_fraction=0.0999",  # 1179 validation windows: 2 processes pad one
]
TINY_LM_BLOCKS = [
    "data=text",
    "task=lm",
    "optim=adamw",
    "data.seq_len=32",
    "data.batch_size=16",
    "optim.lr=1e-2",
    "trainer.max_epochs=null",
]
"""``recipe=tiny_lm`` less its model fields, for a team's own decoder (``model=torch_module``)."""
FAST_DDP = [
    "recipe=blobs",
    "data.samples=1024",
    "data.val_fraction=0.101",  # 103 validation samples: 2 processes pad one
    "trainer.max_epochs=1",
    "strategy=ddp",
    "trainer.devices=2",
]


def assert_val_metrics_are_one_process_ones(run_dir: Path, rel: float = 1e-5) -> None:
    """The run's logged ``val/*`` metrics are ``blocks eval``'s of its weights on one process: no sample counts twice."""
    single = evaluate(str(run_dir))
    logged = {
        name: value for name, value in read_summary(run_dir)["metrics"].items() if name.startswith("val/")
    }
    assert logged == pytest.approx(single, rel=rel, abs=1e-6), run_dir


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def strategy_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sweep dir of ``blocks run -m`` over ``strategy=ddp,fsdp``: :data:`LM` on 2 processes, batch 8 each.

    Read by the sweep test (a run dir per job) and the global-batch test (its DDP and FSDP
    layouts), which then start no 2-process job of their own.
    """
    sweep = tmp_path_factory.mktemp("strategies") / "sweep"
    args = ["run", "-m", *LM, "data.batch_size=8", "strategy=ddp,fsdp", "trainer.devices=2"]
    result = run_in_process([*args, f"hydra.sweep.dir={sweep}"], cwd=sweep.parent)
    assert result.returncode == 0, result.output
    return sweep


def strategy_jobs(sweep: Path) -> dict[str, Path]:
    """The run dir of each job of *sweep*, by the strategy block its plan chose."""
    jobs_by_strategy = {}
    for plan in sweep.glob("*/plan.json"):
        jobs_by_strategy[json.loads(plan.read_text())["blocks"]["strategy"]["block"]] = plan.parent
    return jobs_by_strategy


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")  # with the sweep test, which shares strategy_sweep
def test_global_batch_stream_is_independent_of_the_process_layout(
    strategy_sweep: Path, tmp_path: Path
) -> None:
    """Batch 16 on one process = 8 × accumulate 2 = DDP 2 × 8 = FSDP 2 × 8 = FSDP 2 × 4 × accumulate 2.

    DDP 2 × 8 and FSDP 2 × 8 are the jobs of :func:`strategy_sweep`.
    """
    layouts = {
        "single": ["data.batch_size=16"],
        "accumulate": ["data.batch_size=8", "optim.accumulate=2"],
        "fsdp_deferred_sync": [
            "data.batch_size=4",
            "optim.accumulate=2",
            "strategy=fsdp",
            "trainer.devices=2",
            "strategy.reduce_every_micro_batch=false",
        ],
    }
    run_dirs = {name: tmp_path / name for name in layouts}
    for name, overrides in layouts.items():
        driver.run([*LM, *overrides], run_dirs[name])
    swept = strategy_jobs(strategy_sweep)
    run_dirs.update(ddp=swept["ddp"], fsdp=swept["fsdp"])
    reference = weights(run_dirs["single"])
    for name, run_dir in run_dirs.items():
        summary = read_summary(run_dir)
        assert summary["status"] == "completed"
        assert summary["world_size"] == (2 if "ddp" in name or "fsdp" in name else 1)
        other = weights(run_dir)
        assert sorted(other) == sorted(reference), name
        for key, tensor in reference.items():
            torch.testing.assert_close(other[key], tensor, rtol=1e-4, atol=2e-5, msg=f"{name}: {key}")


DRAWS = "trainer.callbacks=[{_target_: tests.lightning_habits.RandomDraws}]"


@pytest.fixture(scope="module")
def three_ddp_jobs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, int, str]]:
    """Three 2-process ``blocks run`` of :data:`FAST_DDP` (losses logged every 2 steps) started at once.

    (run dir, exit status, stderr) of each: the collision test reads all three, the logging
    test the first, the random-streams test the second (each rank writes its draws,
    :class:`~tests.lightning_habits.RandomDraws`), the warnings test the third, whose rank 0
    warns at every logged step that the ranks' losses differ
    (``monitor.rank_spread_tolerance=1e-9``).
    """
    root = tmp_path_factory.mktemp("three")
    args = [
        sys.executable,
        "-m",
        "blocks",
        "run",
        *FAST_DDP,
        "monitor.log_every_n_steps=2",
        "monitor.progress=off",
    ]
    extra = [[], [DRAWS], ["monitor.rank_spread_tolerance=1e-9"]]
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                spawned(
                    [*args, *extra[i], f"hydra.run.dir={root / str(i)}"],
                    cwd=root,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    env={**os.environ, "BLOCKS_ALLOW_IMPORTS": "tests"},
                )
            )
            for i in range(3)
        ]
        errors = [proc.communicate(timeout=300)[1] for proc in procs]
    return [
        (root / str(i), proc.returncode, err) for i, (proc, err) in enumerate(zip(procs, errors, strict=True))
    ]


@pytest.mark.slow
def test_ddp_logs_every_ranks_loss_and_the_spread(three_ddp_jobs: list[tuple[Path, int, str]]) -> None:
    run_dir, returncode, err = three_ddp_jobs[0]
    assert returncode == 0, err[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 2
    header = (run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    for column in ("train/loss", "train/loss_spread", "train/loss_rank0", "train/loss_rank1", "val/accuracy"):
        assert column in header
    metrics = summary["metrics"]
    assert metrics["val/accuracy"] > 0.9
    assert_val_metrics_are_one_process_ones(run_dir)
    ranks = [metrics["train/loss_rank0"], metrics["train/loss_rank1"]]
    assert metrics["train/loss"] == pytest.approx(sum(ranks) / 2, rel=1e-5)


@pytest.mark.slow
def test_fsdp_with_activation_checkpointing_and_bf16_mixed(tmp_path: Path, monkeypatch) -> None:
    """The tiny decoder with a float32 buffer between FSDP's root and first unit: eval casts there as FSDP did."""
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    summary = driver.run(
        [
            *TINY_LM_BLOCKS,
            *LM[1:],
            "model=torch_module",
            "model.target=tests.fsdp_nets.OffsetDecoder",
            "model.spec_args.vocab_size=vocab_size",
            "model.shard=layers",
            "strategy=fsdp",
            "trainer.devices=2",
            "strategy.activation_checkpointing=true",
            "precision=bf16-mixed",
        ],
        tmp_path,
    )
    assert summary.status == "completed"
    names = sorted(weights(tmp_path))
    assert "layers.0.attn.qkv.weight" in names, "weights are saved under the model's own names"
    assert all(t.dtype == torch.float32 for t in weights(tmp_path).values()), (
        "bf16-mixed keeps float32 weights"
    )
    # eval computes as FSDP's policy did (bf16 parameters, no autocast); autocast differs by ~4e-6
    assert_val_metrics_are_one_process_ones(tmp_path, rel=1e-6)


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")  # with the global-batch test, which shares strategy_sweep
def test_sweep_of_two_process_jobs_gives_one_run_dir_per_job(strategy_sweep: Path) -> None:
    entries = sorted(p.name for p in strategy_sweep.iterdir() if not p.name.startswith("."))
    assert entries == ["0", "1", "multirun.yaml"], entries
    assert sorted(strategy_jobs(strategy_sweep)) == ["ddp", "fsdp"]
    for job in ("0", "1"):
        summary = read_summary(strategy_sweep / job)
        assert summary["status"] == "completed" and summary["world_size"] == 2
        subdirs = {
            p.name for p in (strategy_sweep / job).iterdir() if p.is_dir() and not p.name.startswith(".")
        }
        assert subdirs <= {"checkpoints"}, f"no extra dirs per rank inside a job's run dir: {subdirs}"
        assert_val_metrics_are_one_process_ones(strategy_sweep / job)  # DDP and FSDP, task=lm


LAUNCHER_SWEEP = [
    "recipe=tiny_lm",
    "trainer.max_steps=8",
    "trainer.val_every=null",
    "strategy=ddp",
    "trainer.devices=2",
    "optim.lr=3e-3,1e-3",
]
"""The sweep docs/guides/distributed.md runs through each launcher plugin (its blocks point here)."""


@pytest.mark.parametrize(
    "launcher",
    [
        ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],  # jobs in parallel, 2 processes each
        ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"],
    ],
    ids=["joblib", "submitit_local"],
)
@pytest.mark.slow
def test_hydra_launcher_plugins_run_the_jobs(cli, tmp_path: Path, launcher: list[str]) -> None:
    sweep = tmp_path / "sweep"
    result = cli("run", "-m", *launcher, *LAUNCHER_SWEEP, "monitor.progress=off", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.output
    for job in ("0", "1"):
        summary = read_summary(sweep / job)
        assert summary["status"] == "completed" and summary["world_size"] == 2


@pytest.mark.slow
def test_warnings_of_multi_process_workers_reach_blocks_log(
    three_ddp_jobs: list[tuple[Path, int, str]],
) -> None:
    run_dir, returncode, err = three_ddp_jobs[2]
    assert returncode == 0, err[-3000:]
    assert read_summary(run_dir)["status"] == "completed"
    log = (run_dir / "blocks.log").read_text()
    assert "[rank 0]" in log and "differed across ranks" in log


@pytest.mark.slow
def test_three_two_process_jobs_at_once_never_collide(three_ddp_jobs: list[tuple[Path, int, str]]) -> None:
    for run_dir, returncode, err in three_ddp_jobs:
        assert returncode == 0, err[-3000:]
        assert read_summary(run_dir)["status"] == "completed"
        assert "found in sys.modules" not in err  # no worker runs the torchrun module it imported


@pytest.mark.slow
def test_each_data_parallel_rank_draws_its_own_random_numbers(
    three_ddp_jobs: list[tuple[Path, int, str]], tmp_path: Path, monkeypatch
) -> None:
    """Rank 1's dropout masks and loader workers' seeds differ from rank 0's, which are a one-process run's."""
    run_dir, returncode, err = three_ddp_jobs[1]
    assert returncode == 0, err[-3000:]
    ranks = [json.loads((run_dir / f"draws-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["draws"] != ranks[1]["draws"]
    assert ranks[0]["loader_seed"] != ranks[1]["loader_seed"]
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    single = tmp_path / "single"
    driver.run([*FAST_DDP[:-2], "trainer.max_steps=1", "checkpoint.enabled=false", DRAWS], single)
    assert json.loads((single / "draws-rank0.json").read_text()) == ranks[0]


def test_a_rank_a_resumed_checkpoint_has_no_streams_for_draws_its_own_numbers() -> None:
    """Regression: resumed on more processes than saved the checkpoint, a new rank took rank 0's
    Python and NumPy states (and a torch seed of ``initial_seed() + rank``, another run's rank 0):
    its augmentations repeated rank 0's. It starts its data-parallel index's streams instead, as in
    a fresh run, and a rank the checkpoint has states of gets its own back."""
    import random

    import numpy as np

    from blocks.runtime.checkpointing import restore_rank_streams, rng_state
    from blocks.runtime.seeds import RankStreams

    def draws() -> tuple[float, float, float]:
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    streams = RankStreams(seed=0, index_of=lambda rank: rank)
    saved = [rng_state()]  # what a one-process run's checkpoint holds
    rank_0 = draws()
    restore_rank_streams(saved, 0, streams.start_fresh)
    assert draws() == rank_0
    restore_rank_streams(saved, 1, streams.start_fresh)
    rank_1 = draws()
    assert all(a != b for a, b in zip(rank_0, rank_1, strict=True)), "rank 1 repeats rank 0's numbers"
    streams.start_fresh(1)
    assert draws() == rank_1  # a fresh run's rank 1 stream


def run_two_nodes(cwd: Path, common: list[str], *per_node: list[str]) -> list[tuple[int, str]]:
    """Two `blocks run` invocations, one per "node" (*common* plus that node's overrides), at one rendezvous; their exit statuses and stderr."""
    env = {**os.environ, "BLOCKS_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}"}
    ended = []
    with contextlib.ExitStack() as stack:
        nodes = [
            stack.enter_context(
                spawned(
                    [sys.executable, "-m", "blocks", "run", *common, *extra],
                    cwd=cwd,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            for extra in per_node
        ]
        for node in nodes:
            _, err = node.communicate(timeout=240)
            ended.append((node.returncode, err))
    return ended


@pytest.mark.slow
def test_two_nodes_on_loopback_train_one_job(tmp_path: Path) -> None:
    """Two `blocks run` invocations, one per "node", meet at a c10d rendezvous and train together.

    First with another optim.lr on each node: the job fails on both before training, naming
    the key (before, both trained with the config.yaml written last and exited 0).
    """
    run_dir = tmp_path / "run"
    common = [
        "recipe=blobs",
        "data.samples=1024",
        "trainer.max_epochs=1",
        "strategy=ddp",
        "trainer.nodes=2",
        "trainer.devices=1",
        "monitor.progress=off",
        f"hydra.run.dir={run_dir}",
    ]
    for returncode, err in run_two_nodes(tmp_path, common, ["optim.lr=0.1"], ["optim.lr=0.0001"]):
        assert returncode == 1, err[-3000:]
        assert "started with different configs" in err and "optim.lr=0.1" in err and "optim.lr=0.0001" in err
        assert "run the same command on every node" in err
    summary = read_summary(run_dir)
    assert summary["status"] == "failed" and summary["global_step"] == 0
    assert "optim.lr" in summary["reason"]

    for returncode, err in run_two_nodes(tmp_path, common, [], []):
        assert returncode == 0, err[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert "train/loss_rank1" in (run_dir / "metrics.csv").read_text().splitlines()[0]


def test_multi_node_without_a_rendezvous_is_a_clear_error(cli_in_process, monkeypatch) -> None:
    monkeypatch.setenv("BLOCKS_RDZV_ENDPOINT", "")
    result = cli_in_process("run", *FAST_DDP, "trainer.nodes=2")  # refused before anything starts
    assert result.returncode != 0
    assert "BLOCKS_RDZV_ENDPOINT" in result.output


# A killed worker of a two-process job restarted (by forks of the same server) until the job
# completes: test_faults_processes' restart test.


class GradProbe(pl.Callback):
    """Records, after each micro-batch, whether the sharded parameters hold gradients yet."""

    def __init__(self) -> None:
        self.has_grads: list[bool] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        if len(self.has_grads) < 2:
            self.has_grads.append(any(p.grad is not None for p in pl_module.model.parameters()))


def fsdp_gradients_per_micro_batch(every_micro_batch: bool, run_dir: str) -> list[bool]:
    """Train FSDP on one process for a step of two micro-batches; whether gradients existed after each."""
    plan = jobs.plan(
        [
            *LM,
            "strategy=fsdp",
            "trainer.devices=1",
            "optim.accumulate=2",
            "trainer.max_steps=2",
            "checkpoint.enabled=false",
            f"strategy.reduce_every_micro_batch={str(every_micro_batch).lower()}",
        ]
    )
    built = build_run(plan, Path(run_dir), console=False)
    probe = GradProbe()
    built.trainer.callbacks.append(probe)
    built.trainer.fit(built.module, datamodule=built.datamodule)
    return probe.has_grads


def fsdp_gradients_under_both_settings(run_dir: str) -> dict[str, list[bool]]:
    """:func:`fsdp_gradients_per_micro_batch` with ``strategy.reduce_every_micro_batch`` true, then false."""
    return {
        str(every): fsdp_gradients_per_micro_batch(every, str(Path(run_dir) / str(every)))
        for every in (True, False)
    }


@pytest.fixture(scope="module")
def fsdp_gradients(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[bool]]:
    """Whether the sharded parameters held gradients after each micro-batch, by the setting's ``str``.

    Both runs in one process of their own: torch keeps an FSDP run's device mesh, and with it
    a gloo group's threads and TCPStore server, alive after ``destroy_process_group``; the
    pytest worker would host them for the rest of the suite.
    """
    return call_in_fresh_process(
        fsdp_gradients_under_both_settings, str(tmp_path_factory.mktemp("fsdp-grads"))
    )


@pytest.mark.slow
@pytest.mark.parametrize(("every_micro_batch", "expected"), [(True, [True, True]), (False, [False, True])])
def test_fsdp_gradient_sync_follows_reduce_every_micro_batch(
    fsdp_gradients: dict[str, list[bool]], every_micro_batch: bool, expected: list[bool]
) -> None:
    """Deferred sync keeps gradients unsharded (no reduce-scatter) until the step's last micro-batch."""
    assert fsdp_gradients[str(every_micro_batch)] == expected


TORCH_DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")
"""Set by torch/Lightning in a process that ran a process group; a worker that inherits them ignores MPI."""


@pytest.mark.skipif(
    shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs Open MPI (Debian: openmpi-bin libopenmpi-dev) and mpi4py (pip install '.[mpi]')",
)
@pytest.mark.slow
def test_mpirun_starts_the_same_worker(tmp_path: Path) -> None:
    """The worker entry point under Open MPI's mpirun (Lightning's MPIEnvironment), no torchrun."""
    run_dir = tmp_path / "run"
    driver.prepare([*FAST_DDP, "monitor.progress=off"], run_dir)
    as_root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    result = subprocess.run(
        [
            "mpirun",
            *as_root,
            "--oversubscribe",
            "-np",
            "2",
            sys.executable,
            "-m",
            "blocks.launch.worker",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k not in TORCH_DISTRIBUTED_ENV},
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 2


@pytest.mark.slow
def test_srun_style_workers_are_detected_as_slurm(tmp_path: Path) -> None:
    """Two workers started the way `srun` starts them (SLURM's variables, no torchrun) train one job."""
    run_dir = tmp_path / "run"
    driver.prepare([*FAST_DDP, "monitor.progress=off"], run_dir)
    slurm = {
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "127.0.0.1",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "blocks-test",
        "MASTER_PORT": str(free_port()),
    }
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "OMPI_"))}
    with contextlib.ExitStack() as stack:
        tasks = [
            stack.enter_context(
                spawned(
                    [sys.executable, "-m", "blocks.launch.worker", str(run_dir)],
                    cwd=tmp_path,
                    env={
                        **clean,
                        **slurm,
                        "SLURM_PROCID": str(rank),
                        "SLURM_LOCALID": str(rank),
                    },
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
            for rank in range(2)
        ]
        for task in tasks:
            out, _ = task.communicate(timeout=240)
            assert task.returncode == 0, out[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 2


SRUN_TASK = {"SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
SRUN_TASK |= {"SLURM_NODELIST": "127.0.0.1", "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train"}
"""The variables srun gives its first task (the task counts are set by each test)."""


def without_launchers() -> dict[str, str]:
    """This environment without any launcher's variables (SLURM, Open MPI, torchrun)."""
    launchers = ("SLURM_", "OMPI_", "TORCHELASTIC_")
    return {
        k: v for k, v in os.environ.items() if not k.startswith(launchers) and k not in TORCH_DISTRIBUTED_ENV
    }


@pytest.mark.parametrize(
    ("strategy", "tasks"),
    [
        (["strategy=single"], {"SLURM_NTASKS": "4"}),  # Lightning: "You set --ntasks=4 ... not supported"
        (["strategy=ddp", "trainer.devices=1"], {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2"}),
    ],
)
def test_slurm_variables_a_one_process_run_inherits_are_not_its_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: list[str], tasks: dict[str, str]
) -> None:
    """Regression: `blocks run` in an sbatch script or salloc shell took the allocation's SLURM variables for its
    own job, and Lightning refused them with a traceback about --ntasks or `devices`."""
    for name, value in (SRUN_TASK | tasks).items():
        monkeypatch.setenv(name, value)
    summary = driver.run(["recipe=blobs", "trainer.max_steps=2", "monitor.progress=off", *strategy], tmp_path)
    assert (summary.status, summary.world_size) == ("completed", 1)


def test_a_worker_srun_lays_out_unlike_the_plan_is_refused_naming_the_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: srun's --ntasks-per-node other than trainer.devices failed with Lightning's ValueError
    (a traceback naming Lightning's `devices`), after the run dir's files were started."""
    driver.prepare([*FAST_DDP, "monitor.progress=off"], tmp_path)
    tasks = {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_NNODES": "2"}
    for name, value in (SRUN_TASK | tasks).items():
        monkeypatch.setenv(name, value)
    assert worker.run_worker(tmp_path) == 2
    reason = read_summary(tmp_path)["reason"]
    assert (
        "trainer.devices=2 processes per node, but srun starts 1 task(s) per node (--ntasks-per-node=1)"
        in reason
    )
    assert "trainer.nodes=1, but the SLURM job has 2 node(s) (--nodes=2)" in reason
    assert not (tmp_path / "metrics.csv").exists(), "refused before training wrote anything"


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is not None, reason="mpi4py is installed")
def worker_process(run_dir: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run ``python -m blocks.launch.worker RUN_DIR`` as a launcher (srun, mpirun) would: its status and output."""
    with spawned(
        [sys.executable, "-m", "blocks.launch.worker", str(run_dir)],
        cwd=run_dir.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as task:
        out, _ = task.communicate(timeout=120)
    return task.returncode, out


def test_a_worker_mpirun_started_without_mpi4py_refuses_instead_of_training_a_job_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: without mpi4py no rank found MPI, and Lightning started a whole job per rank in one run dir.

    The worker's own code in this process, as the srun layout test does: the refusal is read from
    the environment before anything trains, and a process of its own showed nothing more.
    """
    run_dir = tmp_path / "run"
    driver.prepare([*FAST_DDP, "monitor.progress=off"], run_dir)
    for name in [k for k in os.environ if k.startswith(("SLURM_", "OMPI_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(name)
    for name in TORCH_DISTRIBUTED_ENV:
        monkeypatch.delenv(name, raising=False)
    mpi_rank = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    for name, value in mpi_rank.items():
        monkeypatch.setenv(name, value)
    returncode = worker.run_worker(run_dir)
    out = capsys.readouterr().err
    assert returncode == 2, out[-3000:]
    assert "mpi4py is not installed" in out and "pip install 'blocks[mpi]'" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert read_summary(run_dir)["status"] == "failed"
    assert not (run_dir / "metrics.csv").exists(), "no rank trained"


@pytest.mark.slow
def test_a_worker_srun_started_exits_130_when_a_signal_stopped_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: an interrupted srun (or mpirun) worker saved and exited 0, so the scheduler marked the job
    completed and the batch script could not requeue it; torchrun's workers still exit 0 (no restart)."""
    run_dir = tmp_path / "run"
    signal_at = "trainer.callbacks=[{_target_: tests.lightning_habits.SignalAtStep, step: 2}]"
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    driver.prepare(["recipe=blobs", "trainer.max_steps=50", "monitor.progress=off", signal_at], run_dir)
    env = without_launchers() | SRUN_TASK | {"SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1"}
    env["PYTHONPATH"] = str(REPO)
    returncode, out = worker_process(run_dir, env)
    assert returncode == 130, out[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted" and "SIGTERM stopped training" in summary["reason"], summary


@pytest.mark.slow
def test_a_stuck_collective_fails_the_job_after_the_timeout_instead_of_hanging(tmp_path: Path) -> None:
    """Rank 1 stops (injected); rank 0's next gradient all-reduce gives up after strategy.collective_timeout_s.

    torchrun then sends rank 1 SIGTERM, and rank 1 ends itself after trainer.shutdown_grace_s,
    not after torchrun's own 30 s: stalled for 20 s, it would otherwise wake up and exit normally.
    """
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = run_cli(
        [
            "run",
            *FAST_DDP,
            "trainer.max_epochs=null",
            "trainer.max_steps=100",
            "strategy.collective_timeout_s=5",
            "monitor.stall_timeout_s=600",  # the watchdog (which hosts the injection hook) must not fire first
            "monitor.progress=off",
            "trainer.shutdown_grace_s=1",  # the least there is: rank 1, stalled, is killed at its end
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env={"BLOCKS_FAULT_STALL": "1:3:20"},
        timeout=300,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.output[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "failed"
    assert "collective operation timed out after strategy.collective_timeout_s=5s" in summary["reason"]
    assert summary["global_step"] <= 4
    assert not (run_dir / "stacks").exists(), "the collective timeout, not the stall watchdog, ended the job"
    assert vanished_ranks(run_dir, 0) == [1], "rank 1 was killed within the grace, before its stall ended"
    assert elapsed < 240, "the job must fail soon after the timeout, not wait for the stalled rank"
