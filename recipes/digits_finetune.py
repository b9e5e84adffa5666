"""Fine-tuning: start from another run's weights with the first layer frozen, at a lower learning rate."""

from blocks import Recipe, recipe
from blocks.data import Digits
from blocks.model import MLP
from blocks.optim import AdamW
from blocks.task import Classification
from blocks.trainer import Trainer


@recipe("digits_finetune")
def digits_finetune() -> Recipe:
    """Fine-tune a digits_mlp run: ``blocks run recipe=digits_finetune model.init_from=RUN_DIR``; layer 0 stays frozen."""
    return Recipe(
        data=Digits(batch_size=64, seed=1),
        model=MLP(hidden=(128, 64), freeze=("0",)),
        task=Classification(label_smoothing=0.05),
        optim=AdamW(lr=5e-4, warmup_steps=5),
        trainer=Trainer(max_epochs=None, max_steps=100, val_every=50),
    )
