"""A fast classification recipe: an MLP on generated Gaussian blobs."""

from blocks import Recipe, recipe


@recipe("blobs")
def blobs() -> Recipe:
    """An MLP classifying generated Gaussian blobs; trains in seconds, for smoke tests and demos."""
    from blocks.data import Blobs
    from blocks.model import MLP
    from blocks.task import Classification
    from blocks.trainer import Trainer

    return Recipe(
        data=Blobs(),
        model=MLP(hidden=(64, 64)),
        task=Classification(),
        trainer=Trainer(max_epochs=3, val_every=None),
    )
