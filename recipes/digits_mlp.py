"""A classifier on real data that ships with scikit-learn: an MLP on 8×8 handwritten digits."""

from blocks import Recipe, recipe


@recipe("digits_mlp")
def digits_mlp() -> Recipe:
    """An MLP on scikit-learn's handwritten digits; about 0.95 validation accuracy in seconds on a CPU."""
    from blocks.data import Digits
    from blocks.model import MLP
    from blocks.optim import AdamW
    from blocks.task import Classification
    from blocks.trainer import Trainer

    return Recipe(
        data=Digits(batch_size=64),
        model=MLP(hidden=(128, 64)),
        task=Classification(),
        optim=AdamW(lr=3e-3, warmup_steps=10),
        trainer=Trainer(max_epochs=None, max_steps=300, val_every=100),
    )
