"""Fine-tuning: start from another run's weights with the first layer frozen, at a lower learning rate."""

from blocks import Recipe, derive, recipe


@recipe("digits_finetune")
def digits_finetune() -> Recipe:
    """Fine-tune a digits_mlp run: ``blocks run recipe=digits_finetune model.init_from=RUN_DIR``; layer 0 stays frozen."""
    return derive(
        "digits_mlp",
        data={"seed": 1},
        model={"freeze": ("0",)},
        task={"label_smoothing": 0.05},
        optim={"lr": 5e-4, "warmup_steps": 5},
        trainer={"max_steps": 100, "val_every": 50},
    )
