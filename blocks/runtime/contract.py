"""The batch contract, checked on real data: what a data block yields and a model returns, against the batch spec.

The plan checks the blocks' declarations (the batch spec, the split sizes) without torch; only
the built datasets and a real batch show whether they hold. A broken declaration need not
fail: a regression loss broadcasts outputs ``[B, 1]`` against targets ``[B]`` to ``[B, B]``
and trains a useless model, cross-entropy takes more logits than there are classes, and a
split longer than declared trains more epochs than planned. So each split's length is
compared with ``num_samples(split)`` when it is built, and the first batch and the model's
outputs for it are checked once, from shapes and dtypes only (no device sync), before the
first loss is computed.

Only what the spec and the task leave no doubt about is checked: the inputs' size per sample
(not their dtype: a model may embed integer ids or normalize uint8 pixels itself), targets of
a layout the spec's built-in task reads (class ids or class probabilities for features), and
the outputs only when the run's objective scores the spec's layout (a package's task with
outputs of its own layout is not second-guessed); a language model may have more logits than
the data's vocabulary (a padded or shared vocabulary), never fewer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from dataclasses import dataclass
from typing import Any

import torch

from blocks.data.adapter import LightningData
from blocks.data.base import BatchSpec, DataBlock, FeatureBatch, RegressionBatch, TokenBatch
from blocks.model.adapter import TorchModule
from blocks.model.base import ModelBlock
from blocks.spec.errors import BlocksError, Problem
from blocks.task.objectives import Objective

FLOAT, INTEGER, REAL, ANY = "float", "int", "real", "any"
"""The dtype families a batch tensor may be required to have (:data:`REAL`: integer or float; :data:`ANY`: not checked)."""

IGNORED = -100
"""The target id cross-entropy ignores (``ignore_index``'s default): padding in token targets."""


@dataclass(frozen=True)
class Expected:
    """What one tensor of a batch must be.

    Attributes:
        name: ``inputs``, ``targets`` or ``outputs``.
        dtype: :data:`FLOAT` (any floating dtype: a precision may convert them), :data:`INTEGER` or :data:`ANY`.
        shape: the shape of one sample (the batch's first dimension comes before it).
        flat: only the number of elements per sample must match (feature vectors a model reshapes itself).
        at_least: the last dimension may be larger (logits over a padded vocabulary).
        rows_per_sample: rows of the tensor per sample (a language model's logits flattened over
            the sequence: ``seq_len``); the first dimension is the batch's size times it.
        meaning: what the last dimension counts, with the spec field that sets it.
        count: the spec field that sets the last dimension (``num_classes``...), or the number of
            ids (:attr:`ids_below`).
        ids_below: integer ids (class ids, token ids) must lie in ``0..ids_below - 1`` (0: not ids);
            targets may also be :data:`IGNORED`. Floating-point tensors are not ids.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    flat: bool = False
    at_least: bool = False
    rows_per_sample: int = 1
    meaning: str = ""
    count: str = ""
    ids_below: int = 0

    def fits(self, tensor: torch.Tensor, batch_size: int) -> bool:
        """Whether *tensor* has this dtype family and shape, for a batch of *batch_size* samples."""
        return _dtype_fits(tensor.dtype, self.dtype) and self._shape_fits(tuple(tensor.shape), batch_size)

    def _shape_fits(self, shape: tuple[int, ...], batch_size: int) -> bool:
        if not shape or shape[0] != batch_size * self.rows_per_sample:
            return False
        if self.flat:
            return len(shape) > 1 and _elements(shape[1:]) == _elements(self.shape)
        if self.at_least:
            return (
                shape[1:-1] == self.shape[:-1]
                and len(shape) == len(self.shape) + 1
                and shape[-1] >= self.shape[-1]
            )
        return shape[1:] == self.shape

    def describe(self, batch_size: int | str) -> str:
        """``float[32, 1]`` (or ``float[batch, 1]``): the dtype family and the whole batch's shape."""
        rows = f"{batch_size}*{self.rows_per_sample}" if self.rows_per_sample > 1 else str(batch_size)
        sizes = [rows, *(str(n) for n in self.shape)]
        if self.at_least:
            sizes[-1] = f">={sizes[-1]}"
        return f"{self.family or 'tensor'}[{', '.join(sizes)}]"

    @property
    def family(self) -> str:
        """The dtype family as messages name it: ``float`` for :data:`REAL` (what data usually holds), "" for :data:`ANY`."""
        return {ANY: "", REAL: FLOAT}.get(self.dtype, self.dtype)


def _elements(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _dtype_fits(dtype: torch.dtype, family: str) -> bool:
    if family == ANY:
        return True
    if family == REAL:
        return not dtype.is_complex and dtype != torch.bool
    if family == FLOAT:
        return dtype.is_floating_point
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def described(tensor: torch.Tensor) -> str:
    """``float32[32]``: a tensor's dtype and shape as the messages show them."""
    return f"{str(tensor.dtype).removeprefix('torch.')}[{', '.join(str(n) for n in tensor.shape)}]"


@dataclass(frozen=True)
class Layout:
    """What a batch of one spec holds, and what a model's outputs for it must be.

    Attributes:
        inputs: the inputs (their size per sample; any dtype).
        targets: the target layouts the spec's built-in task reads (any one of them).
        outputs: the output layouts that task scores (any one of them).
    """

    inputs: Expected
    targets: tuple[Expected, ...]
    outputs: tuple[Expected, ...]


def expected_layout(spec: BatchSpec) -> Layout:
    """The inputs, targets and model outputs a batch of *spec* must have (per sample)."""
    if isinstance(spec, TokenBatch):
        logits = f"one logit per token id (vocab_size={spec.vocab_size}, or more)"
        return Layout(
            Expected("inputs", ANY, (spec.seq_len,), count="vocab_size", ids_below=spec.vocab_size),
            (Expected("targets", INTEGER, (spec.seq_len,), count="vocab_size", ids_below=spec.vocab_size),),
            (
                Expected(
                    "outputs",
                    FLOAT,
                    (spec.seq_len, spec.vocab_size),
                    at_least=True,
                    meaning=logits,
                    count="vocab_size",
                ),
                Expected(
                    "outputs",
                    FLOAT,
                    (spec.vocab_size,),
                    at_least=True,
                    rows_per_sample=spec.seq_len,
                    meaning=logits,
                    count="vocab_size",
                ),
            ),
        )
    if isinstance(spec, FeatureBatch):
        return Layout(
            Expected("inputs", ANY, (spec.num_features,), flat=True),
            (
                Expected("targets", INTEGER, (), count="num_classes", ids_below=spec.num_classes),
                Expected("targets", FLOAT, (spec.num_classes,)),
            ),
            (
                Expected(
                    "outputs",
                    FLOAT,
                    (spec.num_classes,),
                    meaning=f"one logit per class (num_classes={spec.num_classes})",
                    count="num_classes",
                ),
            ),
        )
    assert isinstance(spec, RegressionBatch)
    return Layout(
        Expected("inputs", ANY, (spec.num_features,), flat=True),
        (Expected("targets", REAL, (spec.num_targets,)),),
        (
            Expected(
                "outputs",
                FLOAT,
                (spec.num_targets,),
                meaning=f"one value per target (num_targets={spec.num_targets})",
                count="num_targets",
            ),
        ),
    )


def _block_label(block: DataBlock | ModelBlock | None, kind: str) -> str:
    """``data=blobs (Blobs)``, or the adapter's target: how a message names the block."""
    if block is None:
        return kind
    target = _adapter_target(block)
    name = f"{kind}={block.block_name}" if block.block_name else kind
    return f"{name} ({target})" if target else f"{name} ({type(block).__qualname__})"


def _block_key(block: DataBlock | ModelBlock | None, kind: str) -> str:
    """``model.target`` for an adapter (the class it names is what to fix), else the kind."""
    return f"{kind}.target" if _adapter_target(block) else kind


def _adapter_target(block: DataBlock | ModelBlock | None) -> str | None:
    """The import path an adapter block (``model=torch_module``, ``data=lightning_data``) names; None for others.

    Another block's field named ``target`` (a column to predict, say) is no import path.
    """
    if isinstance(block, (TorchModule, LightningData)):
        return block.target
    return None


@dataclass(frozen=True)
class BatchContract:
    """The batch spec of a run with the blocks that must keep it: checks a batch and the model's outputs for it.

    Attributes:
        spec: the data block's declared batch spec.
        data: the data block (named in the messages; None: just ``data``).
        model: the model block (named in the messages; None: just ``model``).
        scored_layout: whether the run's objective scores outputs of the spec's layout
            (:attr:`blocks.task.objectives.Objective.scores_spec_layout`); False: outputs unchecked.
    """

    spec: BatchSpec
    data: DataBlock | None = None
    model: ModelBlock | None = None
    scored_layout: bool = True

    @classmethod
    def of_run(
        cls, spec: BatchSpec, data: DataBlock | None, model: ModelBlock, objective: Any
    ) -> BatchContract:
        """The contract of a run scoring with *objective* (outputs checked when it scores the spec's layout)."""
        scored = isinstance(objective, Objective) and objective.scores_spec_layout
        return cls(spec, data, model, scored_layout=scored)

    def check_batch(self, batch: Any) -> None:
        """Raise a :class:`BlocksError` on ``data`` unless *batch* is a mapping of ``inputs`` and ``targets`` as the spec says."""
        self._refuse_other_than_a_mapping(batch)
        layout = expected_layout(self.spec)
        for name in ("inputs", "targets"):
            self._refuse_missing_or_not_a_tensor(batch, name)
        size = batch["inputs"].shape[0] if batch["inputs"].dim() else 0
        # a task scoring a layout of its own reads its own targets: only the inputs are the spec's
        for alternatives in ((layout.inputs,), layout.targets) if self.scored_layout else ((layout.inputs,),):
            tensor = batch[alternatives[0].name]
            fitting = [expected for expected in alternatives if expected.fits(tensor, size)]
            if not fitting:
                raise self._data_error(
                    f"yields {alternatives[0].name} {described(tensor)}, but its batch_spec() {self.spec} needs "
                    f"{' or '.join(expected.describe(size) for expected in alternatives)} for a batch of {size}",
                    _fix_for(alternatives, tensor, size),
                )
            self._refuse_ids_out_of_range(tensor, fitting[0])

    def check_outputs(self, outputs: Any, batch: Mapping[str, Any]) -> None:
        """Raise a :class:`BlocksError` on ``model`` unless *outputs* have the shape the spec's task needs.

        Nothing is checked when the run's objective scores outputs of a layout of its own
        (:attr:`scored_layout` False).
        """
        if not self.scored_layout:
            return
        alternatives = expected_layout(self.spec).outputs
        size = batch["inputs"].shape[0]
        if isinstance(outputs, torch.Tensor) and any(
            expected.fits(outputs, size) for expected in alternatives
        ):
            return
        expected = alternatives[0]
        got = described(outputs) if isinstance(outputs, torch.Tensor) else f"a {type(outputs).__name__}"
        label, target = _block_label(self.model, "model"), _adapter_target(self.model)
        raise BlocksError(
            Problem(
                "model.target" if target else "model",
                f"{label} returns {got} for inputs {described(batch['inputs'])}, but the data's {self.spec} "
                f"needs outputs {expected.describe(size)}: {expected.meaning}",
                f"make {target}'s forward return a {expected.describe('batch')} tensor "
                f"(model.spec_args={{<its argument>:{expected.count}}} passes the data's {expected.count} to "
                "its constructor)"
                if target
                else f"choose a model whose outputs have the data's {expected.count}, or a task that scores "
                f"{got} outputs",
                related=("data",),
            )
        )

    def _refuse_other_than_a_mapping(self, batch: Any) -> None:
        if isinstance(batch, Mapping):
            return
        pair = isinstance(batch, (list, tuple)) and len(batch) == 2
        raise self._data_error(
            f"yields batches of {type(batch).__name__}"
            + (" (its items are (inputs, targets) pairs)" if pair else "")
            + ", but blocks reads batch['inputs'] and batch['targets']",
            "return {'inputs': x, 'targets': y} from the dataset's __getitem__ (data=lightning_data adapts "
            "(x, y) pairs of an existing LightningDataModule)",
        )

    def _refuse_missing_or_not_a_tensor(self, batch: Mapping[str, Any], name: str) -> None:
        if name not in batch:
            raise self._data_error(
                f"yields batches with the keys {sorted(map(str, batch))}, without {name!r}",
                "make each item a dict with 'inputs' and 'targets' tensors",
            )
        if not isinstance(batch[name], torch.Tensor):
            raise self._data_error(
                f"yields {name} as {type(batch[name]).__name__}, not a tensor",
                f"make each item's {name!r} a tensor (torch.as_tensor(...)) of the batch spec's shape",
            )

    def _refuse_ids_out_of_range(self, tensor: torch.Tensor, expected: Expected) -> None:
        """Raise unless integer ids lie in ``0..ids_below - 1`` (targets: or :data:`IGNORED`).

        The one check that reads values: a host read, on the first batch only. Out-of-range ids
        fail later in an embedding or cross-entropy without naming the data, on a GPU as a
        device-side assert that ends the process.
        """
        if not expected.ids_below or not _dtype_fits(tensor.dtype, INTEGER) or not tensor.numel():
            return
        ids = tensor.flatten()
        ignorable = expected.name == "targets"
        if ignorable and tensor.dtype.is_signed:
            ids = ids[ids != IGNORED]
        if not ids.numel():
            return
        low, high = (int(value) for value in torch.aminmax(ids))
        if low >= 0 and high < expected.ids_below:
            return
        allowed = f"0..{expected.ids_below - 1}" + (
            f" (or {IGNORED}, which cross-entropy ignores)" if ignorable else ""
        )
        declare = f", or make batch_spec() declare {expected.count}={high + 1}" if low >= 0 else ""
        raise self._data_error(
            f"yields {expected.name} ids from {low} to {high}, but its batch_spec() {self.spec} has "
            f"{expected.count}={expected.ids_below}: ids must lie in {allowed}",
            f"make each item's {expected.name!r} ids count from 0 and stay below {expected.count}="
            f"{expected.ids_below}{declare}",
        )

    def _data_error(self, message: str, fix: str) -> BlocksError:
        return BlocksError(
            Problem(_block_key(self.data, "data"), f"{_block_label(self.data, 'data')} {message}", fix)
        )


def _fix_for(alternatives: tuple[Expected, ...], tensor: torch.Tensor, size: int) -> str:
    """How to make each item's tensor one of *alternatives*."""
    first = alternatives[0]
    shapes = " or ".join(
        f"{expected.family + ' ' if expected.family else ''}tensor of shape {list(expected.shape)}"
        for expected in alternatives
    )
    hint = ""
    if first.shape == (1,) and tuple(tensor.shape) == (size,):
        hint = " (torch.tensor([y]) rather than torch.tensor(y))"
    return (
        f"make each item's {first.name!r} a {shapes}{hint}, or make batch_spec() declare what the items hold"
    )


def check_split_size(data: DataBlock, split: str, dataset: Any) -> None:
    """Raise a :class:`BlocksError` on ``data`` when *dataset*'s length is not ``num_samples(split)``.

    The plan derived the steps per epoch, the epochs and the schedule from ``num_samples``; the
    loaders read the dataset. A dataset without a length (an iterable stream) is not checked.
    """
    if not isinstance(dataset, Sized):
        return
    declared, built = data.num_samples(split), len(dataset)
    if declared != built:
        raise BlocksError(
            Problem(
                _block_key(data, "data"),
                f"{_block_label(data, 'data')} declares {declared} {split} samples (num_samples({split!r})) but "
                f"build({split!r}) returns a dataset of {built}: the plan's steps per epoch and epochs would be wrong",
                f"make {type(data).__qualname__}.num_samples({split!r}) return the length of build({split!r})",
            )
        )
