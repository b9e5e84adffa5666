"""The catalog of checks: every ``check=`` name the plan and composition report, with an example.

Each entry names the blocks a check involves, the key its problem is reported on, and a
command line that triggers it. The test suite plans every example and asserts that the check
fires on that key, and the docs build plans them again to print the real message and fix in
the conflict table (``docs/hooks/reference.py``). So the table shows what the code says, and
a check that is renamed, rekeyed or dropped fails the tests instead of leaving the docs wrong.
A test also asserts that every ``check="..."`` written in ``blocks/`` has an entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from blocks.core.environment import Environment
from blocks.spec.errors import BlocksError, Problem

CPU = Environment(gpus=0, host_memory_bytes=16 * 2**30)
GPU = Environment(gpus=8, gpu_memory_bytes=80 * 2**30, host_memory_bytes=512 * 2**30)

FULL_CHECKPOINT = "memory://blocks-checks/full/step-000000010"
"""A committed full (not sharded) checkpoint that :func:`write_full_checkpoint` creates."""


def write_full_checkpoint() -> None:
    """Commit an empty full checkpoint at :data:`FULL_CHECKPOINT` (in memory; torch-free)."""
    import fsspec

    from blocks.checkpoint import store

    manifest = store.Manifest(
        step=10, epoch=0, world_size=1, sharded=False, global_batch=32, block_digests={}
    )
    with fsspec.open(store.join(FULL_CHECKPOINT, "state.pt"), "wb") as handle:
        handle.write(b"state")  # the manifest lists it; planning never reads it
    store.commit(FULL_CHECKPOINT, manifest)


SHARDS = "memory://blocks-checks/shards"
"""A shard directory with only a manifest that :func:`write_shard_manifest` creates (not local, so cached)."""


def write_shard_manifest() -> None:
    """Write the manifest of a 2-shard, 1M-token data set at :data:`SHARDS` (in memory; no shard data)."""
    import json

    import fsspec

    from blocks.data.shards.manifest import MANIFEST, Manifest, Shard, manifest_json

    shards = tuple(Shard(f"train-{i}.bin", 500_000) for i in range(2))
    manifest = Manifest(SHARDS, "byte", "", 256, "uint16", 2, splits={"train": shards})
    with fsspec.open(f"{SHARDS}/{MANIFEST}", "w") as handle:
        handle.write(json.dumps(manifest_json(manifest)))


@dataclass(frozen=True)
class Check:
    """One named check.

    Attributes:
        name: the stable ``check`` name of the problems it reports.
        blocks: the kinds (or keys) it relates.
        key: the config key its problem names.
        about: what it requires, in one sentence.
        example: overrides that violate it; empty when it takes files to show (tested elsewhere:
            ``recipe-load`` in ``tests/test_cli.py``).
        gpu: plan the example as if on a machine with 8 GPUs.
        setup: prepares what the example needs (e.g. a checkpoint to resume from).
    """

    name: str
    blocks: tuple[str, ...]
    key: str
    about: str
    example: tuple[str, ...]
    gpu: bool = False
    setup: Callable[[], None] | None = field(default=None, compare=False)

    @property
    def contract(self) -> bool:
        """Whether it relates two or more blocks (a contract) rather than one field."""
        return len(self.blocks) > 1


CHECKS: tuple[Check, ...] = (
    # contracts between blocks
    Check(
        "data-model-batch",
        ("data", "model"),
        "model",
        "the model accepts the batch spec (shape, dtype) the data yields",
        ("model=mlp",),
    ),
    Check(
        "data-task-batch",
        ("data", "task"),
        "task",
        "the task scores the batches the data yields (tokens or class labels)",
        ("task=classify",),
    ),
    Check(
        "seq-len-context",
        ("data", "model"),
        "model.context",
        "`data.seq_len` fits the model's context (position embedding)",
        ("data.seq_len=512",),
    ),
    Check(
        "vocab-size",
        ("data", "model"),
        "model.vocab_size",
        "an explicit model vocabulary covers the data's",
        ("model.vocab_size=100",),
    ),
    Check(
        "precision-accelerator",
        ("precision", "trainer"),
        "precision",
        "the precision runs on the resolved accelerator",
        ("precision=16-mixed",),
    ),
    Check(
        "fsdp-precision",
        ("strategy", "precision"),
        "strategy",
        "FSDP's mixed-precision policy comes from the precision block, which has one for it",
        ("strategy=fsdp", "trainer.devices=2", "precision=16-mixed", "trainer.accelerator=gpu"),
        gpu=True,
    ),
    Check(
        "fsdp-model-units",
        ("strategy", "model"),
        "strategy",
        "FSDP shards (and checkpoints activations of) the units the model declares",
        ("recipe=blobs", "strategy=fsdp", "trainer.devices=2"),
    ),
    Check(
        "fsdp-cpu-offload-accelerator",
        ("strategy", "trainer"),
        "strategy.cpu_offload",
        "FSDP offloads GPU shards to host memory: a CPU job has nothing to offload",
        ("recipe=tiny_lm", "strategy=fsdp", "trainer.devices=2", "strategy.cpu_offload=true"),
    ),
    Check(
        "strategy-world-size",
        ("strategy", "trainer"),
        "strategy",
        "`trainer.devices × trainer.nodes` is a world size the strategy runs",
        ("trainer.devices=2",),
    ),
    Check(
        "compile-mode-accelerator",
        ("strategy", "trainer"),
        "strategy.compile_mode",
        "`reduce-overhead` (CUDA graphs) is for a GPU job (a warning on CPU)",
        ("strategy.compile=true", "strategy.compile_mode=reduce-overhead"),
    ),
    Check(
        "compile-cxx",
        ("strategy", "trainer"),
        "strategy.compile",
        "compiling on a CPU needs a C++ compiler (`$CXX`, else `g++`) where the job runs: an error "
        "when it runs on the planning machine, a warning when a launcher runs it elsewhere",
        (),  # needs a machine without a C++ compiler: tests/test_compile.py plans on one
    ),
    Check(
        "mesh-world-size",
        ("strategy", "trainer"),
        "strategy",
        "the strategy's device mesh (`strategy.mesh`) spans `trainer.devices × trainer.nodes` processes",
        (),  # no built-in strategy declares another mesh; tests/test_mesh_ranks.py plans one that does
    ),
    Check(
        "backend-accelerator",
        ("strategy", "trainer"),
        "strategy.backend",
        "the process-group backend runs on the accelerator (NCCL needs GPUs)",
        ("strategy=ddp", "trainer.devices=2", "strategy.backend=nccl", "trainer.accelerator=cpu"),
    ),
    Check(
        "checkpoint-format",
        ("checkpoint", "strategy"),
        "checkpoint.resume",
        "the checkpoint to resume is in the format the strategy loads (full or FSDP shards)",
        ("strategy=fsdp", "trainer.devices=2", f"checkpoint.resume={FULL_CHECKPOINT}"),
        setup=write_full_checkpoint,
    ),
    Check(
        "checkpoint-monitor-metric",
        ("checkpoint", "task"),
        "checkpoint.monitor",
        "the monitored metric is one the job logs (with a did-you-mean)",
        ("checkpoint.monitor=val/accuracy",),
    ),
    Check(
        "checkpoint-monitor-validation",
        ("checkpoint", "data"),
        "checkpoint.monitor",
        "a monitored validation metric has a validation split to come from",
        ("recipe=blobs", "data.val_fraction=0", "checkpoint.monitor=val/loss"),
    ),
    Check(
        "objective-metric",
        ("monitor", "task"),
        "monitor.objective",
        "the metric a sweeper optimizes is one the job logs (with a did-you-mean)",
        ("recipe=digits_mlp", "monitor.objective=val/acuracy"),
    ),
    Check(
        "objective-validation",
        ("monitor", "data"),
        "monitor.objective",
        "a validation objective has a validation split to come from (a warning when minimized: sweepers "
        "get train/loss; an error when maximized)",
        ("recipe=blobs", "data.val_fraction=0", "monitor.objective=val/loss"),
    ),
    Check(
        "launcher-devices",
        ("launcher", "trainer"),
        "hydra.launcher.tasks_per_node",
        "a submitit launcher runs one task per job and gives it `trainer.devices` GPUs",
        ("hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2"),
    ),
    Check(
        "sweeper-direction",
        ("sweeper", "monitor"),
        "hydra.sweeper.direction",
        "an Optuna search optimizes in the direction monitor.objective_mode says, with one objective",
        ("hparams_search=optuna", "monitor.objective=val/accuracy", "monitor.objective_mode=max"),
    ),
    Check(
        "validation-split",
        ("trainer", "data"),
        "trainer.val_every",
        "scheduled validation has a validation split to run on",
        ("recipe=blobs", "data.val_fraction=0", "trainer.val_every=10"),
    ),
    Check(
        "global-batch-divisible",
        ("optim", "data", "trainer"),
        "optim.global_batch",
        "`optim.global_batch` is a multiple of `data.batch_size ×` world size",
        ("recipe=blobs", "data.batch_size=8", "optim.global_batch=60"),
    ),
    Check(
        "global-batch-fits-data",
        ("data", "optim", "trainer"),
        "data.batch_size",
        "the training split holds at least one global batch",
        ("recipe=blobs", "data.samples=100", "data.batch_size=128"),
    ),
    Check(
        "memory-budget",
        ("model", "data", "strategy", "precision", "optim", "trainer"),
        "data.batch_size",
        "the estimated memory per device fits the device (a warning, with the cheapest fixes)",
        ("trainer.device_memory_gb=0.05",),
    ),
    Check(
        "accumulate-or-global-batch",
        ("optim",),
        "optim.accumulate",
        "only one of `optim.accumulate` and `optim.global_batch` is set (a warning)",
        ("recipe=blobs", "data.batch_size=8", "optim.global_batch=64", "optim.accumulate=2"),
    ),
    Check(
        "warmup-shorter-than-training",
        ("optim", "trainer"),
        "optim.warmup_steps",
        "warmup ends before training does (a warning)",
        ("trainer.max_steps=10", "optim.warmup_steps=50"),
    ),
    Check(
        "val-every-within-training",
        ("trainer",),
        "trainer.val_every",
        "scheduled validation comes before the end of training (a warning)",
        ("trainer.max_steps=50", "trainer.val_every=100"),
    ),
    Check(
        "checkpoint-every-within-training",
        ("checkpoint", "trainer"),
        "checkpoint.every_n_steps",
        "periodic checkpoints come before the end of training (a warning)",
        ("trainer.max_steps=50", "checkpoint.every_n_steps=100"),
    ),
    Check(
        "ddp-one-process",
        ("strategy", "trainer"),
        "strategy",
        "DDP with one process is overhead without parallelism (a warning)",
        ("strategy=ddp",),
    ),
    Check(
        "devices-available",
        ("trainer",),
        "trainer.devices",
        "a one-node GPU job asks for no more GPUs than the planning machine has (a warning)",
        ("strategy=ddp", "trainer.devices=16", "trainer.accelerator=gpu"),
        gpu=True,
    ),
    Check(
        "gpu-available",
        ("trainer",),
        "trainer.accelerator",
        "a GPU job planned on a machine without GPUs is meant to run elsewhere (a warning)",
        ("trainer.accelerator=gpu",),
    ),
    # one block's own fields
    Check(
        "training-split",
        ("data",),
        "data",
        "the data has training samples",
        ("data.val_fraction=0.9999",),
    ),
    Check(
        "split-count",
        ("data",),
        "data",
        "a data block's `num_samples` counts no split below zero",
        (),  # no built-in data block miscounts: tests/test_batch_contract.py
    ),
    Check(
        "split-fractions",
        ("data",),
        "data.test_fraction",
        "`data.val_fraction` + `data.test_fraction` leave samples to train on",
        ("recipe=blobs", "data.val_fraction=0.5", "data.test_fraction=0.5"),
    ),
    Check(
        "corpus-files",
        ("data",),
        "data.path",
        "`data.path` names readable files",
        ("data.path=/nonexistent/*.txt",),
    ),
    Check(
        "shard-manifest",
        ("data",),
        "data.path",
        "`data=stream`'s `data.path` holds the `manifest.json` of `blocks data prepare`",
        ("recipe=tiny_lm", "data=stream", "data.path=/nonexistent/shards"),
    ),
    Check(
        "cache-room",
        ("data",),
        "data.cache_limit_gb",
        "the shard cache holds the shards `data=stream` reads at once",
        ("recipe=tiny_lm", "data=stream", f"data.path={SHARDS}", "data.cache_limit_gb=0.001"),
        setup=write_shard_manifest,
    ),
    Check(
        "cache-writable",
        ("data",),
        "data.cache_dir",
        "the shard cache directory can be written",
        ("recipe=tiny_lm", "data=stream", f"data.path={SHARDS}", "data.cache_dir=/dev/null/cache"),
        setup=write_shard_manifest,
    ),
    Check(
        "heads-divide-width",
        ("model",),
        "model.n_heads",
        "attention heads divide the model width",
        ("model.n_heads=5",),
    ),
    Check(
        "nesterov-momentum",
        ("optim",),
        "optim.nesterov",
        "Nesterov needs momentum",
        ("optim=sgd", "optim.nesterov=true", "optim.momentum=0"),
    ),
    Check(
        "fused-clipping",
        ("optim", "precision"),
        "optim.fused",
        "a fused optimizer is not clipped under `*-mixed` precision (Lightning's plugin cannot)",
        ("recipe=blobs", "optim.fused=true", "optim.grad_clip=1.0", "precision=bf16-mixed"),
    ),
    Check(
        "keep-best-monitor",
        ("checkpoint",),
        "checkpoint.monitor",
        "`checkpoint.keep_best` has a metric to rank by",
        ("checkpoint.keep_best=1",),
    ),
    Check(
        "resume-committed",
        ("checkpoint",),
        "checkpoint.resume",
        "an explicit resume URL is a committed checkpoint",
        ("checkpoint.resume=memory://blocks-checks/nothing",),
    ),
    Check(
        "training-length",
        ("trainer",),
        "trainer.max_steps",
        "training has a length",
        ("trainer.max_steps=null", "trainer.max_epochs=null"),
    ),
    Check("range", ("any",), "optim.lr", "a number is within its field's range", ("optim.lr=-1",)),
    Check(
        "finite",
        ("any",),
        "optim.lr",
        "a float field is a finite number: NaN and infinities pass no range check",
        ("optim.lr=nan",),
    ),
    Check(
        "choice",
        ("any",),
        "optim.schedule",
        "a string is one of its field's choices (with a did-you-mean)",
        ("optim.schedule=cosin",),
    ),
    # composition (Hydra and OmegaConf errors, rewritten)
    Check(
        "unknown-group",
        ("config",),
        "traner",
        "the group exists (with a did-you-mean)",
        ("traner.max_steps=5",),
    ),
    Check(
        "unknown-option",
        ("config",),
        "strategy",
        "the group has the option (with a did-you-mean)",
        ("strategy=dpp",),
    ),
    Check(
        "unknown-key",
        ("config",),
        "optim.lrr",
        "the chosen block has the key (with a did-you-mean, or the blocks that have it)",
        ("optim.lrr=1e-3",),
    ),
    Check(
        "type",
        ("config",),
        "optim.lr",
        "a value has its field's type (OmegaConf's validation error, rewritten)",
        ("optim.lr=abc",),
    ),
    Check(
        "interpolation",
        ("config",),
        "optim.lr",
        "an interpolation resolves (OmegaConf's error, rewritten)",
        ("optim.lr=${nope}",),
    ),
    Check(
        "missing-value",
        ("config",),
        "optim.lr",
        "a required (`???`) value is given",
        ("optim.lr=???",),
    ),
    Check(
        "override-syntax",
        ("config",),
        "optim.lr",
        "an override parses (Hydra's grammar error, rewritten)",
        ("optim.lr==",),
    ),
    Check(
        "import-path",
        ("model", "data"),
        "model.target",
        "an adapter's import path names a class or function",
        ("recipe=blobs", "model=torch_module", "model.target=not-a-path"),
    ),
    Check(
        "import-denied",
        ("model", "data"),
        "model.target",
        "import paths never reach modules that run commands or code (os, subprocess, builtins, ...)",
        ("recipe=blobs", "model=torch_module", "model.target=os.system"),
    ),
    Check(
        "import-not-allowed",
        ("model", "data"),
        "model.target",
        "import paths stay inside the module prefixes the user allows (BLOCKS_ALLOW_IMPORTS, pyproject)",
        ("recipe=blobs", "model=torch_module", "model.target=somewhere_else.Net"),
    ),
    Check(
        "env-not-allowed",
        ("hydra",),
        "hydra.job.env_set.MY_SETTING",
        "a config sets only environment variables that tune a process, or that the user allows "
        "(BLOCKS_ALLOW_ENV, pyproject)",
        ("recipe=blobs", "+hydra.job.env_set.MY_SETTING=1"),
    ),
    Check(
        "data-source",
        ("data",),
        "data.source",
        "data.source names files, a directory, a glob or a python: source that can be prepared into shards",
        ("data=stream", "data.source=no-such-file-*.txt"),
    ),
    Check(
        "data-extra",
        ("data",),
        "data",
        "a data block's optional dependency is installed (e.g. scikit-learn for data=digits)",
        (),
    ),
    Check(
        "weights-source",
        ("model",),
        "model.init_from",
        "model.init_from names a run dir, an export or a committed checkpoint with weights",
        (),
    ),
    Check(
        "weights-fit",
        ("model",),
        "model.init_from",
        "the weights model.init_from names fit the model block's parameters, name by name and shape by shape",
        (),
    ),
    Check(
        "eval-split",
        ("data",),
        "data.seed",
        "blocks eval keeps the fields that decide the run's own split (seed, val/test fractions, samples): the split it scores holds no trained-on samples",
        (),
    ),
    Check(
        "eval-split-samples",
        ("data",),
        "--split",
        "the split blocks eval (or a pipeline's Evaluate stage, key split) scores has samples in the run's data block; a pipeline checks this before its first stage",
        (),
    ),
    Check(
        "freeze-prefix",
        ("model",),
        "model.freeze",
        "each model.freeze prefix matches at least one parameter of the model",
        (),
    ),
    Check(
        "recipe-load",
        ("config",),
        "recipe",
        "recipe files load (a warning on every command; choosing a recipe that failed is an error)",
        (),
    ),
    Check(
        "keep-best-candidates",
        ("checkpoint", "trainer"),
        "checkpoint.keep_best",
        "keep_best by a val/ metric has checkpoints saved at validation steps to rank (a warning)",
        (
            "recipe=blobs",
            "checkpoint.keep_best=2",
            "checkpoint.monitor=val/loss",
            "trainer.val_every=5",
            "checkpoint.every_n_steps=3",
            "trainer.max_steps=14",
        ),
    ),
    Check(
        "yaml-syntax",
        ("config",),
        "experiment",
        "a preset file is YAML (the problem names its group, the file, the line and the column)",
        (),
    ),
    Check(
        "block-import",
        ("config",),
        "model",
        "a chosen block's module imports (a package's block whose dependency is missing is named with its import error)",
        (),
    ),
    Check(
        "block-raised",
        ("config",),
        "model",
        "a chosen block's own plan-time code (check, num_parameters, ...) does not raise (one that does is named with "
        "its distribution, version and the line that raised)",
        (),
    ),
    Check(
        "worker-blocks",
        ("config",),
        "model",
        "a multi-process, restartable or Ray run chooses only blocks its worker processes load themselves (blocks' own, "
        "a package's, the project's recipe files), not one only the launching program registered",
        (),
    ),
    Check(
        "name-clash",
        ("config",),
        "project",
        "a project's recipe, block or preset does not take a name blocks, a package or another project file has (the error names both files)",
        (),
    ),
    Check(
        "project-config",
        ("config",),
        "tool.blocks.recipes",
        "the [tool.blocks] recipes and conf entries of the project's pyproject.toml (and BLOCKS_PATH) name directories",
        (),
    ),
    Check(
        "import-kind",
        ("model", "data", "monitor"),
        "model.target",
        "an imported path is a class of the kind its field expects (nn.Module, DataModule, Logger, Callback), never a "
        "function, a LightningModule defines no training_step/validation_step/configure_optimizers blocks would ignore, "
        "and a LightningDataModule no batch-transfer, state_dict, teardown or predict hook blocks would never call",
        (),
    ),
    Check(
        "logger-start",
        ("monitor",),
        "monitor.loggers",
        "every logger is built and started (its experiment, run or tracking URI) before the first training step",
        (),
    ),
    Check(
        "callback-refused",
        ("trainer",),
        "trainer.callbacks[0]",
        "each callback is built with its arguments, and none refuses the Trainer while Lightning sets up",
        (),
    ),
    Check(
        "loader-options",
        ("data",),
        "data.target",
        "a LightningDataModule's loaders have no collate_fn, sampler or training batch size that blocks' loaders would drop",
        (),
    ),
    Check(
        "checkpoint-unsafe",
        ("checkpoint",),
        "checkpoint.resume",
        "a checkpoint to resume loads without unpickling anything but data",
        (),
    ),
    Check(
        "resume-usable",
        ("checkpoint",),
        "checkpoint.resume",
        "a resume that was expected finds a usable checkpoint instead of training from step 0",
        (),
    ),
    Check(
        "checkpoint-dir-foreign",
        ("checkpoint",),
        "checkpoint.dir",
        "no entry blocks did not write sits where the run may save a checkpoint",
        (),
    ),
    Check(
        "sweep-checkpoint-dir",
        ("checkpoint",),
        "checkpoint.dir",
        "the jobs of a sweep keep their checkpoints apart (each resumes from the newest in its checkpoint.dir)",
        (),
    ),
    Check(
        "sweep-objective",
        ("monitor", "data"),
        "monitor.objective",
        "the jobs of a sweep are all ranked by their validation objective, or none is (a job without a "
        "validation split returns train/loss)",
        (),
    ),
    Check(
        "sweep-run-dir",
        ("checkpoint",),
        "hydra.sweep.subdir",
        "each job of a sweep has a run dir of its own (hydra.sweep.dir/hydra.sweep.subdir): checked before "
        "any job starts, and by each job as it starts (a job of a sweep resumes only its own earlier attempt)",
        (),
    ),
    Check(
        "checkpoint-storage",
        ("checkpoint", "trainer"),
        "checkpoint.dir",
        "checkpoints can be written at checkpoint.dir before training starts (memory:// only for one process)",
        (),
    ),
    Check(
        "ray-placement",
        ("trainer",),
        "trainer.devices",
        "with trainer.launcher=ray, the Ray cluster is reachable and has trainer.nodes nodes that fit trainer.devices workers each (checked before anything starts)",
        (),
    ),
    Check(
        "optuna-storage",
        ("sweeper",),
        "hydra.sweeper.storage",
        "an Optuna study kept in a database needs an SQLAlchemy the installed Optuna can use (SQLAlchemy<2 for Optuna 2)",
        (),
    ),
    Check(
        "one-lightning-logger",
        ("monitor",),
        "monitor.loggers",
        "at most one Lightning logger class, the one monitor.logger_args configures",
        (
            "monitor.loggers=[csv,pytorch_lightning.loggers.CSVLogger,pytorch_lightning.loggers.TensorBoardLogger]",
        ),
    ),
    Check(
        "rollback-checkpoints",
        ("monitor", "checkpoint"),
        "monitor.on_nonfinite",
        "rolling back after a non-finite step needs checkpoints to roll back to",
        ("monitor.on_nonfinite=rollback", "checkpoint.enabled=false"),
    ),
    Check(
        "spec-args",
        ("model", "data"),
        "model.spec_args.in_features",
        "each spec_args entry of an adapted module names a field of the data's batch spec",
        (
            "recipe=blobs",
            "model=torch_module",
            "model.target=blocks.model.networks.Decoder",
            "+model.spec_args={in_features:nope}",
        ),
    ),
    Check(
        "divergence-factor",
        ("monitor",),
        "monitor.loss_divergence_factor",
        "the loss divergence factor is above 1 (or 0 to turn the check off)",
        ("monitor.loss_divergence_factor=0.5",),
    ),
    Check(
        "callback-owned-by-block",
        ("trainer", "checkpoint", "monitor"),
        "trainer.callbacks[0]._target_",
        "a Lightning callback whose job a block does (ModelCheckpoint, progress bars) is refused with the block's key",
        ("trainer.callbacks=[{_target_: pytorch_lightning.callbacks.ModelCheckpoint}]",),
    ),
    Check(
        "callback-needs-logger",
        ("trainer", "monitor"),
        "trainer.callbacks[0]._target_",
        "a Lightning callback that logs through a logger (LearningRateMonitor, DeviceStatsMonitor) "
        "has one in monitor.loggers",
        ("trainer.callbacks=[{_target_: pytorch_lightning.callbacks.LearningRateMonitor}]",),
    ),
    Check(
        "callback-metric",
        ("trainer", "task"),
        "trainer.callbacks[0].monitor",
        "a callback's monitor argument names a metric the job logs (with a did-you-mean)",
        (
            "recipe=blobs",
            "trainer.callbacks=[{_target_: pytorch_lightning.callbacks.EarlyStopping, monitor: val_loss}]",
        ),
    ),
    Check(
        "callback-validation",
        ("trainer", "data"),
        "trainer.callbacks[0].monitor",
        "a callback watching a val/ metric has a validation split to read it from",
        (
            "recipe=blobs",
            "data.val_fraction=0",
            "trainer.callbacks=[{_target_: pytorch_lightning.callbacks.EarlyStopping, monitor: val/loss}]",
        ),
    ),
    Check(
        "limit-overfit",
        ("trainer",),
        "trainer.limit_train_batches",
        "limit_train_batches and overfit_batches both choose the training batches: only one may be set",
        ("trainer.overfit_batches=2", "trainer.limit_train_batches=5"),
    ),
    Check(
        "limit-val-off",
        ("trainer", "data"),
        "trainer.limit_val_batches",
        "limit_val_batches=0 turns off validation of a data block that has a validation split (a warning)",
        ("recipe=blobs", "trainer.limit_val_batches=0"),
    ),
    Check(
        "clip-algorithm",
        ("trainer", "optim"),
        "trainer.gradient_clip_algorithm",
        "clipping by value needs the value: optim.grad_clip",
        ("trainer.gradient_clip_algorithm=value", "optim.grad_clip=null"),
    ),
    Check(
        "clip-algorithm-strategy",
        ("trainer", "strategy"),
        "trainer.gradient_clip_algorithm",
        "FSDP clips only by the gradient norm",
        (
            "recipe=blobs",
            "strategy=fsdp",
            "trainer.devices=2",
            "optim.grad_clip=1.0",
            "trainer.gradient_clip_algorithm=value",
        ),
    ),
    Check(
        "anomaly-nonfinite",
        ("trainer", "monitor"),
        "trainer.detect_anomaly",
        "anomaly detection fails at the first NaN, so skip/rollback of non-finite steps cannot run",
        ("trainer.detect_anomaly=true", "monitor.on_nonfinite=skip"),
    ),
    Check(
        "sweep-without-m",
        ("config",),
        "optim.lr",
        "a sweep is given with `-m`",
        ("optim.lr=0.1,0.01",),
    ),
)
"""Every check, contracts first."""


def by_name(name: str) -> Check:
    """The check called *name*."""
    return next(check for check in CHECKS if check.name == name)


def problems_of(check: Check) -> list[Problem]:
    """Every problem planning the check's example reports (composition errors included)."""
    from blocks.core import jobs

    if check.setup is not None:
        check.setup()
    try:
        return list(jobs.plan(list(check.example), GPU if check.gpu else CPU).problems)
    except BlocksError as error:
        return error.problems


def triggered(check: Check, problems: Sequence[Problem] | None = None) -> Problem | None:
    """The problem the check's example reports under its name, or None."""
    found = problems_of(check) if problems is None else problems
    return next((p for p in found if p.check == check.name), None)
