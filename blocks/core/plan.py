"""The plan: every block of a job checked together, with the numbers that follow from them.

Planning is torch-free and fast, so ``blocks plan`` can check a 128-GPU job on a laptop and
``blocks run`` can refuse a broken job before any process starts.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from blocks.checkpoint.base import CheckpointBlock
from blocks.core.block_errors import raised_in_block
from blocks.core.environment import Environment
from blocks.core.provenance import SOURCES_KEY, block_sources
from blocks.data.base import BatchSpec, DataBlock, TokenBatch
from blocks.model.base import ModelBlock
from blocks.monitor.base import MonitorBlock
from blocks.optim.base import OptimBlock
from blocks.precision.base import PrecisionBlock
from blocks.spec.block import KINDS, Block, non_finite_fields
from blocks.spec.errors import (
    BlocksError,
    PlanError,
    Problem,
    ProblemSink,
    Severity,
    did_you_mean,
    problem_list,
)
from blocks.spec.kinds import KIND_TABLE, BlockKind
from blocks.spec.values import json_value
from blocks.strategy.base import MeshShape, StrategyBlock
from blocks.task.base import TaskBlock
from blocks.trainer.base import TrainerBlock

if TYPE_CHECKING:
    from blocks.core.secrets import KeyPath

KIND_BASES: dict[str, type[Block]] = {kind.name: kind.base_class() for kind in KIND_TABLE}
"""Each kind's base class (from the kind table); a block of a kind must subclass it."""


@dataclass(frozen=True)
class Derived:
    """Numbers that follow from the blocks together; shown by ``blocks plan``.

    Attributes:
        accelerator: ``cpu`` or ``gpu`` after resolving ``auto``.
        world_size: processes in the job (devices × nodes).
        micro_batch: samples per device per forward pass (``data.batch_size``).
        accumulate: micro-batches per optimizer step (``optim.accumulate``).
        mesh: the strategy's device mesh for the world size (``strategy.mesh``): how many
            ranks are data-parallel, and how many split each model replica (tensor, pipeline).
        global_batch: samples per optimizer step (micro_batch × data-parallel ranks × accumulate).
        train_samples: samples in the training split.
        val_samples: samples in the validation split (0 with ``trainer.limit_val_batches=0``;
            with ``trainer.overfit_batches``, the overfit batches' samples: validation reads them).
        steps_per_epoch: optimizer steps per pass over the training split (partial global
            batches are dropped; at most ``trainer.limit_train_batches``, or
            ``trainer.overfit_batches``: an epoch is then a pass over those batches).
        total_steps: optimizer steps the job will take.
        total_tokens: tokens the job trains on (steps × global batch × ``seq_len``; 0 unless the
            data yields tokens).
        epochs: passes over the training split that makes.
        warmup_steps: optimizer steps of LR warmup.
        lr: the peak learning rate as configured.
        effective_lr: the peak learning rate the optimizer uses (``optim.lr`` after
            ``optim.lr_scaling``).
        parameters: model parameters (null when the data and model do not fit together).
        memory: the estimated memory per device (null when the model cannot be sized).
    """

    accelerator: str = "cpu"
    devices: int = 1
    nodes: int = 1
    world_size: int = 1
    mesh: MeshShape = field(default_factory=MeshShape)
    micro_batch: int = 0
    accumulate: int = 1
    global_batch: int = 0
    train_samples: int = 0
    val_samples: int = 0
    steps_per_epoch: int = 0
    total_steps: int = 0
    total_tokens: int = 0
    epochs: float = 0.0
    warmup_steps: int = 0
    lr: float = 0.0
    effective_lr: float = 0.0
    parameters: int | None = None
    memory: MemoryEstimate | None = None

    @property
    def data_parallel(self) -> int:
        """Ranks that each read a different share of every global batch (the mesh's ``replicate × shard``)."""
        return self.mesh.data_parallel


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device holds at the peak of a training step, by what holds them.

    The sum is an upper bound of the measured peak: gradients and saved activations are
    counted as if they were all alive at once, while backward frees activations as it makes
    gradients.

    Attributes:
        parameters: the parameters on the device: all of them (replicated), or the shard plus the
            units FSDP gathers at a time (sharded); with mixed precision, the low-precision copies.
        gradients: one gradient per parameter held (sharded under FSDP).
        optimizer: the optimizer's state (e.g. AdamW's two moments), sharded under FSDP.
        activations: what one micro-batch's forward keeps for backward, from the model block
            (null when the model does not say).
        total: the sum.
        device: the memory of one device (null when unknown).
        device_source: where ``device`` comes from: ``trainer.device_memory_gb``, ``detected GPU``
            or ``host memory / devices``.
        sharded: parameters, gradients and optimizer state are split over the processes.
        activation_checkpointing: activations are recomputed in backward.
    """

    parameters: int
    gradients: int
    optimizer: int
    activations: int | None
    total: int
    device: int | None = None
    device_source: str = ""
    sharded: bool = False
    activation_checkpointing: bool = False

    @property
    def over_budget(self) -> bool:
        """Whether the estimate exceeds the device's memory."""
        return self.device is not None and self.total > self.device


@dataclass
class _State:
    blocks: Mapping[str, Block]
    environment: Environment
    batch_spec: BatchSpec | None = None
    derived: Derived = field(default_factory=Derived)
    problems: list[Problem] = field(default_factory=list)
    kinds: tuple[str, ...] = KINDS
    underived: bool = False
    """A block's code raised while the numbers were derived: :attr:`derived` holds none of them."""


class _Underived(Exception):
    """A check read the derived numbers of a plan that could not derive them; the check is skipped."""


class CheckContext:
    """What a block's ``check`` sees: the other blocks, the derived numbers, and a problem sink.

    Problems are reported against a field of the checking block (``ctx.error("lr", ...)``
    reports ``optim.lr``) or a full dotted key (``ctx.error("data.seq_len", ...)``).
    """

    def __init__(self, state: _State, prefix: str) -> None:
        self._state = state
        self._sink = ProblemSink(prefix, state.problems)
        self.error = self._sink.error
        self.warning = self._sink.warning
        self.positive = self._sink.positive
        self.choice = self._sink.choice
        self.within = self._sink.within

    @property
    def metrics(self) -> tuple[str, ...]:
        """Every metric name the job logs: ``val/<name>`` for each of the task's metrics, then the training ones."""
        task: TaskBlock = self._state.blocks["task"]  # type: ignore[assignment]
        monitor: MonitorBlock = self._state.blocks["monitor"]  # type: ignore[assignment]
        names = [f"val/{name}" for name in task.metric_names()]
        names += monitor.metric_names(gpu=self.derived.accelerator == "gpu")
        if isinstance(self._state.batch_spec, TokenBatch):
            names.append("tokens_per_s")  # the data yields tokens: throughput is also counted in them
        return tuple(names)

    def monitored_metric(
        self,
        name: str,
        metric: str,
        *,
        check: str,
        validation_check: str,
        validation_severity: Severity = "error",
        fallback: str = "",
        validation_fix: str = "",
    ) -> None:
        """Report field *name* if the metric it names is never logged (with a did-you-mean).

        A ``val/`` metric also needs a validation split. *fallback* says what happens instead
        (for a warning); *validation_fix*, when given, replaces the usual fix. Every field that
        names a metric (``checkpoint.monitor``, ``monitor.objective``) is checked here, against
        :attr:`metrics`.
        """
        key = self._sink._key(name)
        logged = self.metrics
        if metric not in logged:
            hint = did_you_mean(metric, logged)
            task = self._state.blocks["task"]
            self.error(
                name,
                f"'{metric}' is not a metric this job logs (task={task.block_name} logs {', '.join(logged)})"
                + (f"; {hint}" if hint else ""),
                f"{key}={hint.split(chr(39))[1] if hint else logged[0]}",
                check=check,
                related=("task",),
            )
        elif metric.startswith("val/") and self.derived.train_samples and not self.derived.val_samples:
            report = self.error if validation_severity == "error" else self.warning
            report(
                name,
                f"'{metric}' is never logged: data={self.data.block_name} has no validation split"
                + (f"; {fallback}" if fallback else ""),
                validation_fix
                or f"{key}=train/loss, or give the data a validation split (e.g. data.val_fraction=0.1)",
                check=validation_check,
                related=("data",),
            )

    def block(self, kind: str) -> Block:
        """The block of *kind* in this job."""
        return self._state.blocks[kind]

    @property
    def data(self) -> DataBlock:
        """The data block."""
        return self._state.blocks["data"]  # type: ignore[return-value]

    @property
    def model(self) -> ModelBlock:
        """The model block."""
        return self._state.blocks["model"]  # type: ignore[return-value]

    @property
    def checkpoint(self) -> CheckpointBlock:
        """The checkpoint block."""
        return _typed(self.block("checkpoint"), CheckpointBlock)

    @property
    def optim(self) -> OptimBlock:
        """The optimizer block."""
        return _typed(self.block("optim"), OptimBlock)

    @property
    def monitor(self) -> MonitorBlock:
        """The monitor block."""
        return _typed(self.block("monitor"), MonitorBlock)

    @property
    def batch_spec(self) -> BatchSpec | None:
        """The data's batch spec, or None when the data block could not say."""
        return self._state.batch_spec

    @property
    def derived(self) -> Derived:
        """The derived numbers.

        When a block's code raised while deriving them, a check that reads them ends here and is
        skipped: the plan reports the raise, never a problem found on numbers it does not have.
        """
        if self._state.underived:
            raise _Underived
        return self._state.derived

    @property
    def environment(self) -> Environment:
        """Hardware seen by the planning process."""
        return self._state.environment


@dataclass(frozen=True)
class Plan:
    """A checked composition: the blocks, the derived numbers and every problem found.

    Attributes:
        blocks: the block of each kind.
        choices: the config option chosen for each group (``recipe`` included).
        derived: numbers that follow from the blocks together.
        problems: errors first, then warnings.
        environment: the hardware the plan was made against (frozen into ``plan.json``, so
            workers use the driver's view instead of detecting their own).
        from_environment: the config values read from the environment or passed on from it
            (:func:`blocks.core.secrets.env_interpolations`), by key path, as interpolation text:
            :meth:`to_json` and the plan panel show that text, never the value (a secret).
    """

    blocks: Mapping[str, Block]
    choices: Mapping[str, str]
    derived: Derived
    problems: tuple[Problem, ...]
    environment: Environment = field(default_factory=Environment)
    from_environment: Mapping[KeyPath, str] = field(default_factory=dict)

    @property
    def data(self) -> DataBlock:
        """The data block."""
        return _typed(self.blocks["data"], DataBlock)

    @property
    def model(self) -> ModelBlock:
        """The model block."""
        return _typed(self.blocks["model"], ModelBlock)

    @property
    def task(self) -> TaskBlock:
        """The task block."""
        return _typed(self.blocks["task"], TaskBlock)

    @property
    def optim(self) -> OptimBlock:
        """The optim block."""
        return _typed(self.blocks["optim"], OptimBlock)

    @property
    def strategy(self) -> StrategyBlock:
        """The strategy block."""
        return _typed(self.blocks["strategy"], StrategyBlock)

    @property
    def precision(self) -> PrecisionBlock:
        """The precision block."""
        return _typed(self.blocks["precision"], PrecisionBlock)

    @property
    def checkpoint(self) -> CheckpointBlock:
        """The checkpoint block."""
        return _typed(self.blocks["checkpoint"], CheckpointBlock)

    @property
    def monitor(self) -> MonitorBlock:
        """The monitor block."""
        return _typed(self.blocks["monitor"], MonitorBlock)

    @property
    def trainer(self) -> TrainerBlock:
        """The trainer settings."""
        return _typed(self.blocks["trainer"], TrainerBlock)

    @property
    def ok(self) -> bool:
        """True when there is no error (warnings allowed)."""
        return not self.errors

    @property
    def errors(self) -> list[Problem]:
        """The problems that stop the run."""
        return [p for p in self.problems if p.is_error]

    @property
    def warnings(self) -> list[Problem]:
        """The problems shown but not fatal."""
        return [p for p in self.problems if not p.is_error]

    def raise_for_errors(self) -> None:
        """Raise :class:`PlanError` with every error if the plan is not ok."""
        if not self.ok:
            raise PlanError(self.errors)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view (the content of ``plan.json``)."""
        return {
            "valid": self.ok,
            "recipe": self.choices.get("recipe"),
            "choices": dict(self.choices),
            "blocks": {
                kind: {"block": block.block_name, "fields": self.shown_fields(kind)}
                for kind, block in self.blocks.items()
            },
            "derived": dataclasses.asdict(self.derived),
            "problems": [p.to_json() for p in self.problems],
            "environment": self.environment.to_json(),
            SOURCES_KEY: block_sources(self.blocks),
        }

    def shown_fields(self, kind: str) -> dict[str, Any]:
        """The fields of block *kind* as JSON values, a value from the environment as its interpolation text."""
        fields = json_value(dataclasses.asdict(self.blocks[kind]))
        for path, raw in self.from_environment.items():
            if len(path) < 2 or path[0] != kind:
                continue
            node: Any = fields
            for key in path[1:-1]:
                node = _child(node, key)
            if _child(node, path[-1]) is not None:
                node[path[-1]] = raw
        return fields

    @classmethod
    def thawed(
        cls,
        blocks: Mapping[str, Block],
        frozen: Mapping[str, Any],
        from_environment: Mapping[KeyPath, str] | None = None,
    ) -> Plan:
        """The plan a ``plan.json`` (*frozen*, :meth:`to_json`) records, with its *blocks*: nothing is re-checked or re-derived."""
        derived = dict(frozen["derived"])
        if derived.get("memory") is not None:
            derived["memory"] = MemoryEstimate(**derived["memory"])
        # a plan.json from before meshes were recorded: every rank was data-parallel
        derived["mesh"] = MeshShape(**(derived.get("mesh") or {"replicate": derived.get("world_size", 1)}))
        problems = tuple(
            Problem(
                key=str(p["key"]),
                message=str(p["message"]),
                fix=str(p["fix"]),
                severity=p["severity"],
                check=str(p.get("check") or ""),
                related=tuple(p.get("related", ())),
            )
            for p in frozen.get("problems", ())
        )
        return cls(
            blocks=dict(blocks),
            choices=dict(frozen.get("choices") or {}),
            derived=Derived(**derived),
            problems=problems,
            environment=Environment.from_json(frozen.get("environment") or {}),
            from_environment=dict(from_environment or {}),
        )


T = TypeVar("T", bound=Block)


def _typed(block: Block, cls: type[T]) -> T:
    assert isinstance(block, cls)
    return block


def _child(node: Any, key: str | int) -> Any:
    if isinstance(node, dict):
        return node.get(key)
    if isinstance(node, list) and isinstance(key, int) and key < len(node):
        return node[key]
    return None


def make_plan(
    blocks: Mapping[str, Block],
    choices: Mapping[str, str] | None = None,
    environment: Environment | None = None,
    *,
    kinds: Sequence[BlockKind] = KIND_TABLE,
) -> Plan:
    """Check *blocks* (one per kind of the kind table *kinds*) together and derive the job's numbers."""
    bases = KIND_BASES if kinds is KIND_TABLE else {kind.name: kind.base_class() for kind in kinds}
    names = tuple(kind.name for kind in kinds)
    for kind in names:
        block = blocks.get(kind)
        if not isinstance(block, bases[kind]):
            raise TypeError(f"plan needs a {bases[kind].__name__} for '{kind}', got {block!r}")
    environment = environment or Environment.detect()
    state = _State(blocks=blocks, environment=environment, kinds=names)
    state.underived = not _ran(state, _derive)
    if not state.underived and _ran(state, _derive_parameters):
        _ran(state, _derive_memory)
    _ran(state, _check_finite)
    for kind in names:
        _ran(state, functools.partial(_check_block, kind))
    if not state.underived:  # these read the derived numbers
        for check in (_check_batch_arithmetic, _check_validation, _check_memory):
            _ran(state, check)
    return Plan(
        blocks=dict(blocks),
        choices=dict(choices or {kind: blocks[kind].block_name for kind in names}),
        derived=state.derived,
        problems=tuple(problem_list(state.problems)),
        environment=environment,
    )


def _ran(state: _State, step: Callable[[_State], None]) -> bool:
    """Run one step of planning; False when a block's code raised in it, which is then a problem of the plan.

    Each block's check and each stage runs on its own, so one block that raises hides no other
    problem. A :class:`BlocksError` (a block refusing a value on purpose) and a raise in no
    block's code propagate.
    """
    try:
        step(state)
    except BlocksError:
        raise  # raised on purpose (a block's own check refusing a value): its key and fix stand
    except _Underived:
        return False  # the check needed the numbers a raise left underived; that raise is reported
    except Exception as exc:
        raised = raised_in_block(exc, {kind: state.blocks[kind] for kind in state.kinds})
        if raised is None:
            raise
        state.problems.append(raised)
        return False
    return True


def _check_block(kind: str, state: _State) -> None:
    """The block of *kind*'s own check; a :class:`BlocksError` it raises on purpose is a problem beside the others."""
    try:
        state.blocks[kind].check(CheckContext(state, kind))
    except BlocksError as exc:  # its key and fix stand; another block's problems are not lost to it
        state.problems.extend(exc.problems)


def preflight(plan: Plan) -> Plan:
    """*plan* with the problems of the checks that read storage (the checkpoint to resume), which planning leaves out."""
    state = _State(blocks=plan.blocks, environment=plan.environment, derived=plan.derived)
    plan.checkpoint.preflight(CheckContext(state, "checkpoint"))
    if not state.problems:
        return plan
    return dataclasses.replace(plan, problems=tuple(problem_list([*plan.problems, *state.problems])))


def _check_finite(state: _State) -> None:
    """NaN and infinities in any block's float field are errors (they pass every range check)."""
    for kind in state.kinds:
        for name, value in non_finite_fields(state.blocks[kind]):
            state.problems.append(
                Problem(
                    key=f"{kind}.{name}",
                    message=f"must be a finite number, got {value}",
                    fix=f"set {kind}.{name} to a finite number (see `blocks list {kind}`)",
                    check="finite",
                )
            )


def _derive(state: _State) -> None:
    data: DataBlock = state.blocks["data"]  # type: ignore[assignment]
    optim: OptimBlock = state.blocks["optim"]  # type: ignore[assignment]
    trainer: TrainerBlock = state.blocks["trainer"]  # type: ignore[assignment]
    devices = max(1, int(trainer.devices or 1))
    nodes = max(1, int(trainer.nodes or 1))
    world = devices * nodes
    mesh = _mesh(state, world)
    micro = max(0, data.batch_size)
    accumulate = max(1, optim.accumulate)
    per_micro_step = micro * mesh.data_parallel
    if optim.global_batch and per_micro_step and optim.global_batch % per_micro_step == 0:
        accumulate = optim.global_batch // per_micro_step
    global_batch = per_micro_step * accumulate
    try:
        state.batch_spec = data.batch_spec()
        train = data.num_samples("train")
        val = data.num_samples("val")
    except Exception:
        train = val = 0
    steps_per_epoch = train // global_batch if global_batch else 0
    if trainer.limit_train_batches and trainer.limit_train_batches > 0:
        steps_per_epoch = min(steps_per_epoch, trainer.limit_train_batches)
    if trainer.overfit_batches and trainer.overfit_batches > 0 and global_batch:
        # an epoch is the first overfit_batches global batches, and validation reads the same ones
        steps_per_epoch = min(steps_per_epoch, trainer.overfit_batches)
        val = min(train, trainer.overfit_batches * global_batch)
    if trainer.limit_val_batches == 0:
        val = 0  # validation is turned off: no val/ metric exists
    max_steps = trainer.max_steps
    max_epochs = trainer.max_epochs
    candidates = []
    if max_steps:
        candidates.append(max_steps)
    if max_epochs:
        candidates.append(max_epochs * steps_per_epoch)
    total = min(candidates) if candidates else 0
    state.derived = Derived(
        accelerator=state.environment.resolve_accelerator(str(trainer.accelerator)),
        devices=devices,
        nodes=nodes,
        world_size=world,
        mesh=mesh,
        micro_batch=micro,
        accumulate=accumulate,
        global_batch=global_batch,
        train_samples=train,
        val_samples=val,
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        total_tokens=total
        * global_batch
        * (state.batch_spec.seq_len if isinstance(state.batch_spec, TokenBatch) else 0),
        epochs=round(total / steps_per_epoch, 3) if steps_per_epoch else 0.0,
        warmup_steps=optim.warmup_steps,
        lr=optim.lr,
        effective_lr=optim.effective_lr(global_batch),
    )


def _derive_parameters(state: _State) -> None:
    """The model's parameter count for the data's batches, when the model can say (else it stays None)."""
    model: ModelBlock = state.blocks["model"]  # type: ignore[assignment]
    if state.batch_spec is None or not isinstance(state.batch_spec, model.accepts or object):
        return
    try:
        parameters = model.num_parameters(state.batch_spec)
    except (ValueError, ZeroDivisionError):
        return
    if parameters is not None and parameters > 0:
        state.derived = dataclasses.replace(state.derived, parameters=parameters)


def _derive_memory(state: _State) -> None:
    """The memory estimate per device, once the parameters are known."""
    if state.derived.parameters is not None:
        memory = _estimate_memory(state, state.derived.parameters)
        state.derived = dataclasses.replace(state.derived, memory=memory)


def _mesh(state: _State, world: int) -> MeshShape:
    """The strategy's mesh for *world* processes; one that spans another number is an error (then all data-parallel)."""
    strategy = state.blocks.get("strategy")
    if not isinstance(strategy, StrategyBlock):
        return MeshShape(replicate=world)
    mesh = strategy.mesh(world)
    if mesh.world_size == world and min(mesh.replicate, mesh.shard, mesh.tensor, mesh.pipeline) >= 1:
        return mesh
    state.problems.append(
        Problem(
            key="strategy",
            message=(
                f"strategy={strategy.block_name} lays out {mesh.world_size} processes "
                f"(replicate {mesh.replicate} × shard {mesh.shard} × tensor {mesh.tensor} × "
                f"pipeline {mesh.pipeline}), but trainer.devices × trainer.nodes = {world}"
            ),
            fix="set trainer.devices and trainer.nodes to the processes the strategy's mesh spans",
            check="mesh-world-size",
            related=("trainer.devices", "trainer.nodes"),
        )
    )
    return MeshShape(replicate=world)


def _estimate_memory(state: _State, parameters: int) -> MemoryEstimate:
    """Parameters, gradients, optimizer state and activations per device under the strategy and precision."""
    model: ModelBlock = state.blocks["model"]  # type: ignore[assignment]
    optim: OptimBlock = state.blocks["optim"]  # type: ignore[assignment]
    strategy: StrategyBlock = state.blocks["strategy"]  # type: ignore[assignment]
    precision: PrecisionBlock = state.blocks["precision"]  # type: ignore[assignment]
    d = state.derived
    spec = state.batch_spec
    assert spec is not None
    param_bytes = DTYPE_BYTES.get(precision.param_dtype, 4)
    compute_bytes = DTYPE_BYTES.get(precision.compute_dtype, 4)
    mixed = precision.param_dtype != precision.compute_dtype
    layout = strategy.memory_layout()
    sharded = layout.shards_parameters
    checkpointing = layout.activation_checkpointing and model.shard_units() is not None
    offload = layout.cpu_offload
    held = -(-parameters // d.mesh.shard) if sharded else parameters
    resident = held * param_bytes
    if sharded:
        unit = model.unit_parameters(spec) or 0
        units = model.unit_count() if model.shard_units() is not None else 0
        gathered = max(0, parameters - units * unit) + min(units, 2) * unit
        resident = (0 if offload else resident) + gathered * compute_bytes
    elif mixed:
        resident += parameters * compute_bytes  # autocast's low-precision copy of each weight
    gradients = 0 if (sharded and offload) else held * param_bytes
    optimizer = 0 if (sharded and offload) else held * param_bytes * optim.state_per_parameter()
    try:
        elements = model.activation_elements(spec, max(0, d.micro_batch), checkpointing=checkpointing)
    except (ValueError, ZeroDivisionError, AssertionError):
        elements = None
    activations = elements * compute_bytes if elements is not None and elements >= 0 else None
    total = resident + gradients + optimizer + (activations or 0)
    device, source = _device_memory(state)
    return MemoryEstimate(
        parameters=resident,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        total=total,
        device=device,
        device_source=source,
        sharded=sharded,
        activation_checkpointing=checkpointing,
    )


def _device_memory(state: _State) -> tuple[int | None, str]:
    trainer: TrainerBlock = state.blocks["trainer"]  # type: ignore[assignment]
    configured = trainer.device_memory_gb
    if configured:
        in_bytes = configured * GIB
        # NaN, inf, 1e308 and values <= 0 are the trainer's errors; the estimate has no device then
        if not math.isfinite(in_bytes) or in_bytes < 1:
            return None, ""
        return int(in_bytes), "trainer.device_memory_gb"
    env = state.environment
    if state.derived.accelerator == "gpu":
        return (env.gpu_memory_bytes, "detected GPU") if env.gpu_memory_bytes else (None, "")
    if env.host_memory_bytes and env.host_memory_bytes >= state.derived.devices:
        return env.host_memory_bytes // max(1, state.derived.devices), "host memory / devices"
    return None, ""


def _check_batch_arithmetic(state: _State) -> None:
    d = state.derived
    data = state.blocks["data"]
    for split, count in (("train", d.train_samples), ("val", d.val_samples)):
        if count >= 0:
            continue
        state.problems.append(
            Problem(
                key="data",
                message=f"data={data.block_name} counts {count} {split} samples: "
                f"{type(data).__qualname__}.num_samples('{split}') is negative",
                fix=f"make {type(data).__qualname__}.num_samples('{split}') count the {split} split's samples "
                "(0 for a split the data does not have)",
                check="split-count",
            )
        )
    if d.train_samples == 0 and state.batch_spec is not None:
        state.problems.append(
            Problem(
                key="data",
                message=f"data={data.block_name} has no training samples",
                fix="give the data more samples (a larger corpus, or a shorter data.seq_len)",
                check="training-split",
            )
        )
    if d.global_batch and d.train_samples and d.steps_per_epoch == 0:
        state.problems.append(
            Problem(
                key="data.batch_size",
                message=(
                    f"the training split has {d.train_samples} samples, fewer than one global batch of "
                    f"{d.global_batch} (data.batch_size={d.micro_batch} × data-parallel size {d.data_parallel} × "
                    f"optim.accumulate={d.accumulate})"
                ),
                fix="lower data.batch_size or optim.accumulate, or use more data",
                check="global-batch-fits-data",
                related=("optim.accumulate", "trainer.devices", "trainer.nodes"),
            )
        )


def _check_validation(state: _State) -> None:
    trainer: TrainerBlock = state.blocks["trainer"]  # type: ignore[assignment]
    val_every = trainer.val_every
    total = state.derived.total_steps
    if val_every and total and val_every > total and state.derived.val_samples:
        state.problems.append(
            Problem(
                key="trainer.val_every",
                message=f"validation every {val_every} steps never comes before the end of training ({total} steps)",
                fix=f"trainer.val_every={max(1, total // 4)} (the end of training is always validated)",
                severity="warning",
                check="val-every-within-training",
                related=("trainer.max_steps", "trainer.max_epochs"),
            )
        )
    if val_every and state.derived.val_samples == 0 and state.derived.train_samples:
        state.problems.append(
            Problem(
                key="trainer.val_every",
                message="validation is scheduled but the data has no validation split",
                fix="trainer.val_every=null, or give the data a validation split (e.g. data.val_fraction=0.1)",
                severity="error",
                check="validation-split",
                related=("data",),
            )
        )


def format_bytes(n: int) -> str:
    """A byte count for people: ``512 KiB``, ``3.2 MiB``, ``41.5 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"


def _check_memory(state: _State) -> None:
    """Warn when the memory estimate exceeds the device, with the cheapest fixes first."""
    memory = state.derived.memory
    if memory is None or not memory.over_budget:
        return
    assert memory.device is not None
    d = state.derived
    model: ModelBlock = state.blocks["model"]  # type: ignore[assignment]
    strategy: StrategyBlock = state.blocks["strategy"]  # type: ignore[assignment]
    fixes = []
    activations = memory.activations or 0
    fixed = memory.total - activations
    if activations and fixed < memory.device and d.micro_batch > 1:
        factor = 2
        while d.micro_batch // factor > 1 and fixed + activations // factor > memory.device:
            factor *= 2
        if fixed + activations // factor <= memory.device and d.micro_batch % factor == 0:
            fixes.append(
                f"data.batch_size={d.micro_batch // factor} optim.accumulate={d.accumulate * factor} "
                f"(same global batch of {d.global_batch})"
            )
    has_units = model.shard_units() is not None
    if activations and has_units and not memory.activation_checkpointing:
        fixes.append(
            "strategy.activation_checkpointing=true"
            if strategy.shards_parameters
            else "strategy=fsdp strategy.activation_checkpointing=true"
        )
    if not memory.sharded and has_units and d.world_size > 1:
        fixes.append(
            f"strategy=fsdp (shards parameters, gradients and optimizer state over {d.world_size} processes)"
        )
    if not fixes:
        fixes.append("a smaller model or more devices with strategy=fsdp")
    parts = (
        f"parameters {format_bytes(memory.parameters)}, gradients {format_bytes(memory.gradients)}, "
        f"optimizer {format_bytes(memory.optimizer)}, activations {format_bytes(activations)}"
    )
    state.problems.append(
        Problem(
            key="data.batch_size" if activations > fixed else "strategy",
            message=(
                f"the estimated peak memory per device, {format_bytes(memory.total)} ({parts}), exceeds the "
                f"{format_bytes(memory.device)} of one device ({memory.device_source})"
            ),
            fix="; or ".join(fixes),
            severity="warning",
            check="memory-budget",
            related=("data.batch_size", "strategy", "precision", "trainer.device_memory_gb"),
        )
    )
