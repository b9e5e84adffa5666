"""``strategy.compile``: planned like any key, and a compiled model trains to the eager model's loss."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from blocks.launch import driver
from blocks.spec.errors import BlocksError

TINY = [
    "recipe=blobs",
    "model.hidden=[16]",
    "data.samples=512",
    "trainer.max_steps=12",
    "trainer.max_epochs=null",
    "monitor.log_every_n_steps=4",
    "monitor.progress=off",
    "checkpoint.enabled=false",
]


def test_an_unknown_compile_mode_names_the_key_and_the_modes(tmp_path: Path) -> None:
    with pytest.raises(BlocksError) as refused:
        driver.prepare([*TINY, "strategy.compile=true", "strategy.compile_mode=fastest"], tmp_path)
    problem = refused.value.problems[0]
    assert problem.key == "strategy.compile_mode"
    assert "max-autotune" in problem.message + problem.fix


def _train(run_dir: Path, overrides: list[str]) -> tuple[dict[str, float], list[bool]]:
    """The last metrics row of an in-process run, and whether each forward call ran under the compiler."""
    import torch

    from blocks.runtime.trainer import build_run

    plan = driver.prepare([*TINY, *overrides], run_dir)
    built = build_run(plan, run_dir, console=False)
    compiling: list[bool] = []
    built.module.model.register_forward_pre_hook(
        lambda module, args: compiling.append(torch.compiler.is_compiling())
    )
    built.trainer.fit(built.module, datamodule=built.datamodule)
    built.recorder.close()
    return dict(built.recorder.last), compiling


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("gcc") is None and shutil.which("cc") is None, reason="inductor needs a C compiler"
)
def test_a_compiled_model_trains_to_the_eager_loss(tmp_path: Path) -> None:
    eager, eager_compiling = _train(tmp_path / "eager", [])
    compiled, compiled_compiling = _train(tmp_path / "compiled", ["strategy.compile=true"])
    assert not any(eager_compiling)
    assert any(compiled_compiling), "the model was not compiled"
    assert math.isclose(compiled["train/loss"], eager["train/loss"], rel_tol=1e-3)
