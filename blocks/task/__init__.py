"""Task blocks: losses and metrics."""

from blocks.task.base import TaskBlock
from blocks.task.classify import Classification
from blocks.task.lm import LanguageModeling
from blocks.task.regress import Regression

__all__ = ["Classification", "LanguageModeling", "Regression", "TaskBlock"]
