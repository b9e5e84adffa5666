"""The package's blocks: torch-free descriptions, built lazily."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from blocks import register
from blocks.data import DataBlock, FeatureBatch
from blocks.model import ModelBlock

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.data import Dataset

    from blocks.core.plan import CheckContext
    from blocks.data import BatchSpec

ROWS = 300
FEATURES = 4
CLASSES = 3


@register("orchids")
@dataclass(frozen=True, kw_only=True)
class Orchids(DataBlock):
    """The orchids table shipped inside the package: 4 measurements, 3 species.

    Attributes:
        val_rows: rows held out for validation (the last rows of the table).
        standardize: scale every feature to zero mean and unit variance.
    """

    batch_size: int = 16
    val_rows: int = 60
    standardize: bool = True

    def batch_spec(self) -> FeatureBatch:
        """Four features, three classes."""
        return FeatureBatch(num_features=FEATURES, num_classes=CLASSES)

    def num_samples(self, split: str) -> int:
        """Rows in *split* (no test split: 0)."""
        return {"train": ROWS - self.val_rows, "val": self.val_rows}.get(split, 0)

    def build(self, split: str) -> Dataset:
        """The split of the shipped CSV as a dataset of ``inputs``/``targets`` dicts."""
        from acme_tabular.table import load_split

        return load_split(self, split)

    def check(self, ctx: CheckContext) -> None:
        """The validation rows must leave rows to train on."""
        super().check(ctx)
        if not 0 <= self.val_rows < ROWS:
            ctx.error("val_rows", f"must be in [0, {ROWS}), got {self.val_rows}", "data.val_rows=60")


@register("resnet_mlp")
@dataclass(frozen=True, kw_only=True)
class ResidualMLP(ModelBlock):
    """A residual MLP for tabular features: a stem, ``depth`` residual blocks, a head.

    Attributes:
        width: width of the residual stream.
        depth: number of residual blocks.
    """

    accepts = (FeatureBatch,)

    width: int = 32
    depth: int = 2

    def num_parameters(self, spec: BatchSpec) -> int:
        """Stem, blocks (two linear layers and a norm each) and head."""
        assert isinstance(spec, FeatureBatch)
        w = self.width
        stem = spec.num_features * w + w
        block = 2 * (w * w + w) + 2 * w
        head = w * spec.num_classes + spec.num_classes
        return stem + self.depth * block + head

    def build(self, spec: BatchSpec) -> nn.Module:
        """The network for *spec*."""
        from acme_tabular.network import ResidualMLPNet

        assert isinstance(spec, FeatureBatch)
        return ResidualMLPNet(spec.num_features, spec.num_classes, self.width, self.depth)

    def check(self, ctx: CheckContext) -> None:
        """Width and depth must be positive."""
        super().check(ctx)
        ctx.positive("width", self.width)
        ctx.positive("depth", self.depth, allow_zero=True)
