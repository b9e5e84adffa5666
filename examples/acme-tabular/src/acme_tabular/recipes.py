"""The package's Python recipe: ``recipe=acme/orchids``."""

from acme_tabular.blocks import Orchids, ResidualMLP
from blocks import Recipe, recipe
from blocks.task import Classification
from blocks.trainer import Trainer


@recipe("orchids")
def orchids() -> Recipe:
    """A residual MLP classifying the shipped orchids table; trains in seconds on CPU."""
    return Recipe(
        data=Orchids(),
        model=ResidualMLP(),
        task=Classification(),
        trainer=Trainer(max_epochs=5, val_every=None),
    )
