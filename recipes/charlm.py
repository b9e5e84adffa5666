"""The default recipe: a character-level transformer language model on text that ships with Python."""

from blocks import Recipe, recipe


@recipe("charlm")
def charlm() -> Recipe:
    """A small GPT on the byte stream of Python's ``email`` package sources; learns in about a minute on a CPU."""
    from blocks.data import Text
    from blocks.model import Transformer
    from blocks.monitor import Monitor
    from blocks.optim import AdamW
    from blocks.task import LanguageModeling
    from blocks.trainer import Trainer

    return Recipe(
        data=Text(seq_len=128, batch_size=32),
        model=Transformer(d_model=128, n_layers=4, n_heads=4, context=128),
        task=LanguageModeling(),
        optim=AdamW(lr=3e-3, warmup_steps=30, weight_decay=0.1),
        monitor=Monitor(log_every_n_steps=10),
        trainer=Trainer(max_steps=400, max_epochs=None, val_every=100),
    )
