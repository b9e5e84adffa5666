"""The built-in blocks by kind and name, as import paths: the registry imports a class only when chosen.

``tests/test_catalog_value.py`` imports every kind's modules and checks that what they
register is exactly this table, so the two cannot drift apart. A new built-in block is one
``@register`` in its module and one line here.
"""

from __future__ import annotations

BUILTIN_BLOCKS: dict[str, dict[str, str]] = {
    "data": {
        "blobs": "blocks.data.blobs:Blobs",
        "diabetes": "blocks.data.bundled:Diabetes",
        "digits": "blocks.data.bundled:Digits",
        "lightning_data": "blocks.data.adapter:LightningData",
        "stream": "blocks.data.stream:Stream",
        "text": "blocks.data.text:Text",
    },
    "model": {
        "mlp": "blocks.model.mlp:MLP",
        "torch_module": "blocks.model.adapter:TorchModule",
        "transformer": "blocks.model.transformer:Transformer",
    },
    "task": {
        "classify": "blocks.task.classify:Classification",
        "lm": "blocks.task.lm:LanguageModeling",
        "regress": "blocks.task.regress:Regression",
    },
    "optim": {
        "adamw": "blocks.optim.adamw:AdamW",
        "sgd": "blocks.optim.adamw:SGD",
    },
    "strategy": {
        "ddp": "blocks.strategy.ddp:DDP",
        "fsdp": "blocks.strategy.fsdp:FSDP",
        "single": "blocks.strategy.single:Single",
    },
    "precision": {
        "16-mixed": "blocks.precision.modes:FP16Mixed",
        "32-true": "blocks.precision.modes:Float32",
        "bf16-mixed": "blocks.precision.modes:BF16Mixed",
        "bf16-true": "blocks.precision.modes:BF16True",
    },
    "checkpoint": {"default": "blocks.checkpoint.base:Checkpoint"},
    "monitor": {"default": "blocks.monitor.base:Monitor"},
    "trainer": {"default": "blocks.trainer.base:Trainer"},
}
"""kind → name → ``module:Class`` of every block ``blocks`` ships."""
