"""``data=lightning_data``: an existing ``LightningDataModule`` class as a data block.

The plan stays torch-free, so the block declares what the datamodule yields (the batch spec
and the size of each split); the build checks the declaration against the real datasets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING

from blocks.data.base import BatchSpec, DataBlock, FeatureBatch, TokenBatch
from blocks.spec.errors import ConfigError, Problem
from blocks.spec.imports import Kind, check_import_paths, instantiate, nested_paths, resolve
from blocks.spec.registry import register

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from blocks.core.plan import CheckContext

BATCHES = ("features", "tokens")


UNCALLED_HOOKS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"),
        "move what they do to a batch into the dataset's items (__getitem__, run by the loader workers) "
        "or into the model's forward (run on the device)",
    ),
    (
        ("state_dict", "load_state_dict"),
        "make the datasets follow from data.kwargs alone (a seeded split, say): blocks' checkpoints do "
        "not hold the datamodule's state, and a resume builds the datamodule anew",
    ),
    (
        ("teardown", "on_exception"),
        "release what they would in the dataset itself, or leave it to the end of the process: blocks "
        "keeps only the datasets, not the datamodule",
    ),
    (
        ("predict_dataloader",),
        "blocks has no predict loop (blocks eval scores the val or test split)",
    ),
)
"""The LightningDataModule hooks Lightning would call that ``data=lightning_data`` does not, in groups, each with
its fix. It calls ``prepare_data``, ``setup`` and the train, val and test dataloaders only."""


def uncalled_hooks(cls: type) -> list[str]:
    """The hooks of :data:`UNCALLED_HOOKS` that *cls* overrides (Lightning's own base methods never count)."""
    return [
        name
        for names, _ in UNCALLED_HOOKS
        for name in names
        if hasattr(cls, name)
        and not getattr(getattr(cls, name), "__module__", "").startswith(("pytorch_lightning.", "lightning."))
    ]


def _refuse_uncalled_hooks(cls: type) -> tuple[str, str] | None:
    """Refuse a datamodule whose own hooks blocks' loaders and checkpoints would never call."""
    own = uncalled_hooks(cls)
    if not own:
        return None
    fixes = [fix for names, fix in UNCALLED_HOOKS if any(name in own for name in names)]
    return (
        f"is a LightningDataModule that defines {', '.join(own)}; data=lightning_data takes only its "
        "datasets (blocks makes the loaders, moves the batches to the device and checkpoints the run), "
        f"so {'these' if len(own) > 1 else 'it'} would never be called",
        "; ".join(fixes) + f"; then delete them from the class, or name a subclass that restores Lightning's "
        f"own ({own[0]} = LightningDataModule.{own[0]}, ...), or write a data block (see the docs: Write a block)",
    )


DATAMODULE_CLASS = Kind(
    "a LightningDataModule class",
    # pytorch_lightning and lightning.pytorch have distinct base classes: check the protocol.
    lambda cls: all(hasattr(cls, m) for m in ("setup", "train_dataloader")),
    refuses=_refuse_uncalled_hooks,
)
"""What ``data.target`` must name: a LightningDataModule only when blocks would call all of its own hooks."""


@register("lightning_data")
@dataclass(frozen=True, kw_only=True)
class LightningData(DataBlock):
    """An existing ``LightningDataModule`` class, named by import path; blocks makes the loaders.

    Its ``train_dataloader().dataset`` and ``val_dataloader().dataset`` are used (and
    ``test_dataloader().dataset`` for ``blocks eval --split test`` when it defines one); items may be
    ``{inputs, targets}`` dicts or ``(inputs, targets)`` pairs. Loader options blocks would not
    honour are refused when the run builds the data, never dropped: a ``collate_fn`` of its own,
    a sampler other than a plain shuffled or sequential one, or a training ``batch_size`` other
    than ``data.batch_size``. So is, before anything starts, a class that defines hooks blocks
    would never call (:data:`UNCALLED_HOOKS`: the batch-transfer hooks, ``state_dict`` and
    ``load_state_dict``, ``teardown``, ``on_exception``, ``predict_dataloader``); blocks calls
    ``prepare_data``, ``setup`` and the train, val and test dataloaders.

    Attributes:
        target: import path of the LightningDataModule class (its module prefix must be allowed).
        kwargs: constructor arguments; a nested ``{_target_: ...}`` builds an object (allowed prefixes only).
        batch: ``features`` (feature vectors → class labels) or ``tokens`` (token ids → next tokens).
        num_features: with ``batch=features``: length of each feature vector.
        num_classes: with ``batch=features``: number of class labels.
        vocab_size: with ``batch=tokens``: number of token ids.
        seq_len: with ``batch=tokens``: tokens per sample.
        train_samples: length of the train set (checked when built).
        val_samples: length of the val set, 0 when the datamodule has none (checked when built).
        test_samples: length of the test set, 0 when the datamodule has no ``test_dataloader``
            (checked when built).
    """

    target: str = MISSING
    kwargs: dict[str, Any] = field(default_factory=dict)
    batch: str = "features"
    num_features: int = 0
    num_classes: int = 0
    vocab_size: int = 0
    seq_len: int = 0
    train_samples: int = 0
    val_samples: int = 0
    test_samples: int = 0

    def batch_spec(self) -> BatchSpec:
        """The declared batch spec."""
        if self.batch == "tokens":
            return TokenBatch(vocab_size=self.vocab_size, seq_len=self.seq_len)
        return FeatureBatch(num_features=self.num_features, num_classes=self.num_classes)

    def num_samples(self, split: str) -> int:
        """The declared size of *split*."""
        return {"train": self.train_samples, "val": self.val_samples, "test": self.test_samples}.get(split, 0)

    def import_paths(self) -> list[tuple[str, str, Kind]]:
        """The datamodule class and every nested ``_target_`` (a class)."""
        return [("data.target", self.target, DATAMODULE_CLASS), *nested_paths(self.kwargs, "data.kwargs")]

    def prepare_node(self, *, global_zero: bool = True) -> None:
        """The datamodule's ``prepare_data``, as Lightning calls it.

        On each node, or on the job's first process only when its ``prepare_data_per_node`` is False.
        """
        datamodule = self._datamodule()
        if datamodule.prepare_data_per_node or global_zero:
            datamodule.prepare_data()

    def build(self, split: str) -> Dataset:
        """The datamodule's dataset for *split*, as ``{inputs, targets}`` samples (after :meth:`prepare_node`)."""
        from blocks.data.foreign import DictSamples

        datamodule = self._datamodule()
        if split == "test":
            if not defines_test_loader(type(datamodule)):
                raise ConfigError(
                    Problem(
                        "data.test_samples",
                        f"declares {self.test_samples} test samples but {self.target} has no test_dataloader()",
                        "data.test_samples=0 (the datamodule has no test split)",
                    )
                )
            datamodule.setup("test")
            loader = datamodule.test_dataloader()
        else:
            datamodule.setup("fit")
            loader = datamodule.train_dataloader() if split == "train" else datamodule.val_dataloader()
        refuse_loader_options(loader, split, self.batch_size, self.target)
        dataset = loader.dataset
        declared = self.num_samples(split)
        if len(dataset) != declared:
            raise ConfigError(
                Problem(
                    f"data.{split}_samples",
                    f"declares {declared} samples but {self.target}'s {split} set has {len(dataset)}",
                    f"data.{split}_samples={len(dataset)}",
                )
            )
        return DictSamples(dataset)

    def _datamodule(self) -> Any:
        """A new instance of the datamodule class, built from ``data.kwargs``."""
        cls = resolve(self.target, "data.target", kind=DATAMODULE_CLASS)
        return cls(**instantiate(dict(self.kwargs), "data.kwargs"))

    def check(self, ctx: CheckContext) -> None:
        """The import path must be allowed and the declared spec and sizes complete."""
        super().check(ctx)
        check_import_paths(ctx, "data", self.target, self.kwargs)
        ctx.choice("batch", self.batch, BATCHES)
        needed = ("num_features", "num_classes") if self.batch == "features" else ("vocab_size", "seq_len")
        for name in (*needed, "train_samples"):
            if getattr(self, name) <= 0:
                ctx.error(
                    name,
                    f"must be declared (> 0): the plan reads it without importing {self.target}",
                    f"data.{name}=<value of your datamodule>",
                    check="range",
                )
        ctx.positive("val_samples", self.val_samples, allow_zero=True)
        ctx.positive("test_samples", self.test_samples, allow_zero=True)


def defines_test_loader(cls: type) -> bool:
    """Whether *cls* defines ``test_dataloader`` itself (Lightning's base only raises)."""
    owner = next((c for c in cls.__mro__ if "test_dataloader" in vars(c)), None)
    return owner is not None and not owner.__module__.startswith(("pytorch_lightning.", "lightning."))


def refuse_loader_options(loader: Any, split: str, batch_size: int, target: str) -> None:
    """Raise :class:`ConfigError` when *loader* has options blocks' own loader would drop.

    blocks makes the loaders (its seeded, resumable, distributed order and its collate), taking
    only the dataset: a custom ``collate_fn`` or sampler would be silently lost, and so would a
    training batch size other than ``data.batch_size``.
    """
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, default_collate

    where = f"{target}'s {split}_dataloader()"
    problems = []
    collate = getattr(loader, "collate_fn", default_collate)
    if collate is not default_collate:
        problems.append(
            Problem(
                "data.target",
                f"{where} has its own collate_fn ({getattr(collate, '__qualname__', collate)}), which "
                "data=lightning_data would not use: blocks batches the dataset's items itself",
                "make the dataset's items tensors or (inputs, targets) pairs that need no collate_fn, "
                "or write a data block (see the docs: Write a block)",
                check="loader-options",
            )
        )
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    if type(sampler) not in (RandomSampler, SequentialSampler) or type(batch_sampler) not in (
        BatchSampler,
        type(None),
    ):
        custom = sampler if type(sampler) not in (RandomSampler, SequentialSampler) else batch_sampler
        problems.append(
            Problem(
                "data.target",
                f"{where} uses the sampler {type(custom).__name__}, which data=lightning_data would not "
                "use: blocks orders the samples itself (seeded, resumable, split across processes)",
                "drop the custom sampler (shuffle=True or False is fine), or write a data block",
                check="loader-options",
            )
        )
    own_batch = getattr(loader, "batch_size", None)
    if split == "train" and own_batch is not None and own_batch != batch_size:
        problems.append(
            Problem(
                "data.batch_size",
                f"is {batch_size}, but {where} batches {own_batch} samples; blocks makes the loader with "
                "data.batch_size",
                f"data.batch_size={own_batch}",
                check="loader-options",
            )
        )
    if problems:
        raise ConfigError(problems)
