"""Language models on streamed token shards: Python's ``email`` sources, BPE-tokenized on first use."""

from blocks import Recipe, recipe


@recipe("streamlm")
def streamlm() -> Recipe:
    """A charlm-sized GPT on BPE token shards of the ``email`` sources, read through data=stream."""
    from blocks.data import Stream
    from blocks.model import Transformer
    from blocks.monitor import Monitor
    from blocks.optim import AdamW
    from blocks.task import LanguageModeling
    from blocks.trainer import Trainer

    return Recipe(
        # the ``email`` sources with a 2048-token BPE trained on them, prepared into the cache on first plan
        data=Stream(source="python:email", tokenizer="bpe:2048", seq_len=128, batch_size=32),
        model=Transformer(d_model=128, n_layers=4, n_heads=4, context=128),
        task=LanguageModeling(),
        optim=AdamW(lr=3e-3, warmup_steps=30, weight_decay=0.1),
        monitor=Monitor(log_every_n_steps=10),
        trainer=Trainer(max_steps=400, max_epochs=None, val_every=100),
    )


@recipe("streamgpt")
def streamgpt() -> Recipe:
    """A larger GPT (about 12M parameters) on the same shards, with a longer context; meant for a GPU (the corpus is small: about 60 epochs)."""
    from blocks.data import Stream
    from blocks.model import Transformer
    from blocks.monitor import Monitor
    from blocks.optim import AdamW
    from blocks.task import LanguageModeling
    from blocks.trainer import Trainer

    return Recipe(
        data=Stream(source="python:email", tokenizer="bpe:2048", seq_len=256, batch_size=32),
        model=Transformer(d_model=384, n_layers=6, n_heads=6, context=256),
        task=LanguageModeling(),
        optim=AdamW(lr=1e-3, warmup_steps=100, weight_decay=0.1),
        monitor=Monitor(log_every_n_steps=20),
        trainer=Trainer(max_steps=600, max_epochs=None, val_every=200),
    )
