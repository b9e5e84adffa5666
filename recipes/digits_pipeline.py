"""A pipeline: pretrain on digits, fine-tune with the first layer frozen, evaluate, export."""

from blocks import Evaluate, Export, Pipeline, Train, recipe


@recipe("digits_pipeline")
def digits_pipeline() -> Pipeline:
    """Pretrain → finetune (from pretrain's weights, layer 0 frozen) → evaluate → export; each stage in its own dir."""
    return Pipeline(
        stages=(
            Train("pretrain", overrides=("recipe=digits_mlp",)),
            Train("finetune", overrides=("recipe=digits_finetune",), init_from="pretrain"),
            Evaluate("evaluate", source="finetune"),
            Export("export", source="finetune"),
        )
    )
