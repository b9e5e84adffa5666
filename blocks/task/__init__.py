"""Task blocks: losses and metrics."""

from typing import TYPE_CHECKING

from blocks.spec.lazy import lazy_exports

if TYPE_CHECKING:
    from blocks.task.base import TaskBlock
    from blocks.task.classify import Classification
    from blocks.task.lm import LanguageModeling
    from blocks.task.regress import Regression

__all__ = ["Classification", "LanguageModeling", "Regression", "TaskBlock"]

# Importing the package imports none of its blocks: each module loads when a name is first used.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Classification": "blocks.task.classify",
        "LanguageModeling": "blocks.task.lm",
        "Regression": "blocks.task.regress",
        "TaskBlock": "blocks.task.base",
    },
)
