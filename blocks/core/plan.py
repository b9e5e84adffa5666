"""The plan: every block of a job checked together, with the numbers that follow from them.

Planning is torch-free and fast, so ``blocks plan`` can check a 128-GPU job on a laptop and
``blocks run`` can refuse a broken job before any process starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from blocks.checkpoint.base import CheckpointBlock
from blocks.core.block import KINDS, Block
from blocks.core.environment import Environment
from blocks.core.errors import PlanError, Problem, ProblemSink, problem_list
from blocks.data.base import BatchSpec, DataBlock
from blocks.model.base import ModelBlock
from blocks.monitor.base import MonitorBlock
from blocks.optim.base import OptimBlock
from blocks.precision.base import PrecisionBlock
from blocks.strategy.base import StrategyBlock
from blocks.task.base import TaskBlock
from blocks.trainer.base import TrainerBlock

KIND_BASES: dict[str, type[Block]] = {
    "data": DataBlock,
    "model": ModelBlock,
    "task": TaskBlock,
    "optim": OptimBlock,
    "strategy": StrategyBlock,
    "precision": PrecisionBlock,
    "checkpoint": CheckpointBlock,
    "monitor": MonitorBlock,
    "trainer": TrainerBlock,
}


@dataclass(frozen=True)
class Derived:
    """Numbers that follow from the blocks together; shown by ``blocks plan``.

    Attributes:
        accelerator: ``cpu`` or ``gpu`` after resolving ``auto``.
        world_size: processes in the job (devices × nodes).
        micro_batch: samples per device per forward pass (``data.batch_size``).
        accumulate: micro-batches per optimizer step (``optim.accumulate``).
        global_batch: samples per optimizer step (micro_batch × world_size × accumulate).
        train_samples: samples in the training split.
        val_samples: samples in the validation split.
        steps_per_epoch: optimizer steps per pass over the training split (partial global
            batches are dropped).
        total_steps: optimizer steps the job will take.
        epochs: passes over the training split that makes.
        warmup_steps: optimizer steps of LR warmup.
        lr: the peak learning rate as configured.
        effective_lr: the peak learning rate the optimizer uses.
        parameters: model parameters (null when the data and model do not fit together).
    """

    accelerator: str = "cpu"
    devices: int = 1
    nodes: int = 1
    world_size: int = 1
    micro_batch: int = 0
    accumulate: int = 1
    global_batch: int = 0
    train_samples: int = 0
    val_samples: int = 0
    steps_per_epoch: int = 0
    total_steps: int = 0
    epochs: float = 0.0
    warmup_steps: int = 0
    lr: float = 0.0
    effective_lr: float = 0.0
    parameters: int | None = None


@dataclass
class _State:
    blocks: Mapping[str, Block]
    environment: Environment
    batch_spec: BatchSpec | None = None
    derived: Derived = field(default_factory=Derived)
    problems: list[Problem] = field(default_factory=list)


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
    def batch_spec(self) -> BatchSpec | None:
        """The data's batch spec, or None when the data block could not say."""
        return self._state.batch_spec

    @property
    def derived(self) -> Derived:
        """The derived numbers."""
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
    """

    blocks: Mapping[str, Block]
    choices: Mapping[str, str]
    derived: Derived
    problems: tuple[Problem, ...]

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
                kind: {"block": block.block_name, "fields": _plain(dataclasses.asdict(block))}
                for kind, block in self.blocks.items()
            },
            "derived": dataclasses.asdict(self.derived),
            "problems": [p.to_json() for p in self.problems],
        }


T = TypeVar("T", bound=Block)


def _typed(block: Block, cls: type[T]) -> T:
    assert isinstance(block, cls)
    return block


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def make_plan(
    blocks: Mapping[str, Block],
    choices: Mapping[str, str] | None = None,
    environment: Environment | None = None,
) -> Plan:
    """Check *blocks* (one per kind) together and derive the job's numbers."""
    for kind in KINDS:
        block = blocks.get(kind)
        if not isinstance(block, KIND_BASES[kind]):
            raise TypeError(f"plan needs a {KIND_BASES[kind].__name__} for '{kind}', got {block!r}")
    state = _State(blocks=blocks, environment=environment or Environment.detect())
    _derive(state)
    for kind in KINDS:
        blocks[kind].check(CheckContext(state, kind))
    _check_batch_arithmetic(state)
    _check_validation(state)
    return Plan(
        blocks=dict(blocks),
        choices=dict(choices or {kind: blocks[kind].block_name for kind in KINDS}),
        derived=state.derived,
        problems=tuple(problem_list(state.problems)),
    )


def _derive(state: _State) -> None:
    data: DataBlock = state.blocks["data"]  # type: ignore[assignment]
    model: ModelBlock = state.blocks["model"]  # type: ignore[assignment]
    optim: OptimBlock = state.blocks["optim"]  # type: ignore[assignment]
    trainer = state.blocks["trainer"]
    devices = max(1, int(getattr(trainer, "devices", 1) or 1))
    nodes = max(1, int(getattr(trainer, "nodes", 1) or 1))
    world = devices * nodes
    micro = max(0, data.batch_size)
    accumulate = max(1, optim.accumulate)
    per_micro_step = micro * world
    if optim.global_batch and per_micro_step and optim.global_batch % per_micro_step == 0:
        accumulate = optim.global_batch // per_micro_step
    global_batch = per_micro_step * accumulate
    try:
        state.batch_spec = data.batch_spec()
        train = data.num_samples("train")
        val = data.num_samples("val")
    except Exception:
        train = val = 0
    parameters = None
    if state.batch_spec is not None and isinstance(state.batch_spec, model.accepts or object):
        try:
            parameters = model.num_parameters(state.batch_spec)
        except (ValueError, ZeroDivisionError):
            parameters = None
    steps_per_epoch = train // global_batch if global_batch else 0
    max_steps = getattr(trainer, "max_steps", None)
    max_epochs = getattr(trainer, "max_epochs", None)
    candidates = []
    if max_steps:
        candidates.append(max_steps)
    if max_epochs:
        candidates.append(max_epochs * steps_per_epoch)
    total = min(candidates) if candidates else 0
    state.derived = Derived(
        accelerator=state.environment.resolve_accelerator(str(getattr(trainer, "accelerator", "auto"))),
        devices=devices,
        nodes=nodes,
        world_size=world,
        micro_batch=micro,
        accumulate=accumulate,
        global_batch=global_batch,
        train_samples=train,
        val_samples=val,
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        epochs=round(total / steps_per_epoch, 3) if steps_per_epoch else 0.0,
        warmup_steps=optim.warmup_steps,
        lr=optim.lr,
        effective_lr=optim.lr,
        parameters=parameters,
    )


def _check_batch_arithmetic(state: _State) -> None:
    d = state.derived
    if d.train_samples == 0 and state.batch_spec is not None:
        state.problems.append(
            Problem(
                key="data",
                message=f"data={state.blocks['data'].block_name} has no training samples",
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
                    f"{d.global_batch} (data.batch_size={d.micro_batch} × world size {d.world_size} × "
                    f"optim.accumulate={d.accumulate})"
                ),
                fix="lower data.batch_size or optim.accumulate, or use more data",
                check="global-batch-fits-data",
                related=("optim.accumulate", "trainer.devices", "trainer.nodes"),
            )
        )


def _check_validation(state: _State) -> None:
    trainer = state.blocks["trainer"]
    if getattr(trainer, "val_every", None) and state.derived.val_samples == 0 and state.derived.train_samples:
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
