"""``strategy.compile``: planned like any key, and a compiled model trains to the eager model's loss."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from blocks.core import jobs
from blocks.launch import driver
from blocks.spec.errors import BlocksError
from blocks.strategy.base import has_inductor_cxx

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


def test_cuda_graphs_on_a_cpu_are_warned_of_and_the_job_runs() -> None:
    plan = jobs.plan([*TINY, "strategy.compile=true", "strategy.compile_mode=reduce-overhead"])
    assert plan.ok
    warned = [p for p in plan.problems if p.check == "compile-mode-accelerator"]
    assert [p.key for p in warned] == ["strategy.compile_mode"]
    assert "CUDA graphs" in warned[0].message


def _without_cxx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This process's machine, as the plan sees it, has no C++ compiler (``PATH`` holds none, ``CXX`` unset)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("TORCH_INDUCTOR_INSTALL_GXX", raising=False)


def test_compiling_on_a_cpu_without_a_cxx_compiler_is_refused_before_the_job_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_cxx(monkeypatch, tmp_path)
    with pytest.raises(BlocksError) as refused:
        driver.prepare([*TINY, "strategy.compile=true"], tmp_path / "run")
    problem = next(p for p in refused.value.problems if p.check == "compile-cxx")
    assert problem.key == "strategy.compile"
    assert "g++" in problem.message and "strategy.compile=false" in problem.fix
    monkeypatch.setenv("CXX", str(tmp_path / "bin" / "g++"))  # a CXX that names no compiler
    assert jobs.plan([*TINY, "strategy.compile=true"]).errors[0].check == "compile-cxx"
    assert not [p for p in jobs.plan(TINY).problems if p.check == "compile-cxx"]


@pytest.mark.parametrize(
    "elsewhere",
    [
        ["trainer.launcher=ray"],
        ["hydra/launcher=ray", "hydra.mode=MULTIRUN"],
        ["hydra/launcher=submitit_slurm", "hydra.mode=MULTIRUN"],
    ],
    ids=["ray-workers", "ray-sweep", "slurm-sweep"],
)
def test_without_a_cxx_compiler_a_job_run_elsewhere_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, elsewhere: list[str]
) -> None:
    _without_cxx(monkeypatch, tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    plan = jobs.plan([*TINY, "strategy.compile=true", *elsewhere])
    problems = [p for p in plan.problems if p.check == "compile-cxx"]
    assert [p.severity for p in problems] == ["warning"]
    if "ray" in elsewhere[0]:
        # Regression: without RAY_ADDRESS Ray starts a local instance, which runs the job here; only warned of.
        monkeypatch.delenv("RAY_ADDRESS")
        plan = jobs.plan([*TINY, "strategy.compile=true", *elsewhere])
        assert [p.severity for p in plan.problems if p.check == "compile-cxx"] == ["error"]


def _train(run_dir: Path, overrides: list[str]) -> tuple[dict[str, float], Counter[str]]:
    """The last metrics row of an in-process run (and the ``step`` it ended at), and dynamo's counts during it.

    Nothing is registered on the model: a hook changes the path dynamo takes into the module.
    """
    import torch
    from torch._dynamo.utils import counters

    from blocks.runtime.trainer import build_run

    plan = driver.prepare(overrides, run_dir)
    built = build_run(plan, run_dir, console=False)
    torch._dynamo.reset()
    counters.clear()
    built.trainer.fit(built.module, datamodule=built.datamodule)
    built.recorder.close()
    compiled = Counter(counters["stats"]) + Counter({"graph_breaks": counters["graph_break"].total()})
    return {**built.recorder.last, "step": built.trainer.global_step}, compiled


@pytest.mark.slow
@pytest.mark.skipif(not has_inductor_cxx(), reason="inductor needs a C++ compiler ($CXX, else g++)")
def test_a_compiled_model_trains_to_the_eager_loss(tmp_path: Path) -> None:
    """``model=mlp``'s forward is ``nn.Sequential``'s, in torch.nn: compiled all the same.

    (The transformer's forward is blocks' own code, which dynamo always traced; the GPU suite
    compiles it at 125M and 1B parameters.)
    """
    eager, eager_counts = _train(tmp_path / "eager", TINY)
    compiled, compiled_counts = _train(tmp_path / "compiled", [*TINY, "strategy.compile=true"])
    assert eager_counts["unique_graphs"] == 0
    assert compiled_counts["unique_graphs"] > 0, "the model was not compiled"
    assert math.isclose(compiled["train/loss"], eager["train/loss"], rel_tol=1e-3)


FSDP_TORCH_NN_UNITS = [
    "data=text",
    "task=lm",
    "optim=adamw",
    "data.seq_len=32",
    "data.batch_size=8",
    "model=torch_module",
    "model.target=tests.fsdp_nets.TorchNNLayersDecoder",
    "model.spec_args.vocab_size=vocab_size",
    "model.shard=layers",
    "strategy=fsdp",
    "trainer.devices=1",
    "trainer.max_steps=4",
    "trainer.max_epochs=null",
    "trainer.val_every=null",
    "data.val_fraction=0",
    "monitor.objective=train/loss",
    "checkpoint.every_n_steps=2",
    "monitor.log_every_n_steps=2",
    "monitor.progress=off",
]
"""A decoder whose two units are ``nn.Sequential`` under FSDP2 on this one process, 4 steps, a checkpoint every 2.

No validation: its no-grad forward compiles graphs of its own, and the test counts the training forward's.
"""


@pytest.mark.slow
@pytest.mark.skipif(not has_inductor_cxx(), reason="inductor needs a C++ compiler ($CXX, else g++)")
def test_under_fsdp_each_unit_is_compiled_and_resumes_to_and_from_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each unit's forward is compiled before ``fully_shard``, FSDP2's hooks outside the graph (torchtitan's way).

    Regression: the root was compiled after sharding. Dynamo broke the graph at FSDP2's root
    hook (dynamo-disabled), gave up on the root's forward (a graph break in its loop over the
    units), and compiled only the frames it met under it that are not torch.nn's: units whose
    forward is torch.nn's own (``nn.Sequential``) ran eagerly, without a word. (The GPT's
    layers, blocks' code, were caught so, behind a graph break at every step.)
    """
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests")
    eager, _ = _train(tmp_path / "eager", FSDP_TORCH_NN_UNITS)
    from_eager = tmp_path / "eager" / "checkpoints" / "step-000000002"
    compiled, counts = _train(
        tmp_path / "compiled",
        [*FSDP_TORCH_NN_UNITS, "strategy.compile=true", f"checkpoint.resume={from_eager}"],
    )
    assert counts["unique_graphs"] == 1, "the units were not compiled (one graph serves both)"
    assert counts["graph_breaks"] == 0, "FSDP2's hooks stay outside the compiled graph"
    assert math.isclose(compiled["train/loss"], eager["train/loss"], rel_tol=1e-3)
    from_compiled = tmp_path / "compiled" / "checkpoints" / "step-000000004"
    on, _ = _train(
        tmp_path / "eager-on",
        [*FSDP_TORCH_NN_UNITS, "trainer.max_steps=5", f"checkpoint.resume={from_compiled}"],
    )
    assert on["step"] == 5 and math.isfinite(on["train/loss"]), "an eager run goes on from the compiled one"


def test_a_strategy_packages_parallelizer_without_compile_mode_is_parallelized_then_compiled(
    tmp_path: Path,
) -> None:
    """A ``(model, device_mesh)`` parallelizer (the documented contract) gets no ``compile_mode``: blocks compiles after it.

    Regression: FSDP's parallelizer took over compiling its units, and every parallelizer was
    called with ``compile_mode=``; a strategy package's two-argument one failed with a TypeError.
    """
    from blocks.runtime.trainer import build_run

    built = build_run(driver.prepare([*TINY, "strategy.compile=true"], tmp_path), tmp_path, console=False)
    parallelized: list[object] = []
    built.module.parallelize = lambda model, device_mesh: parallelized.append(model)
    built.module.configure_model()
    assert parallelized == [built.module.model]
    assert built.module.model._compiled_call_impl is not None, (
        "the model was not compiled after parallelizing"
    )


@pytest.mark.parametrize(
    "wrappers, prefix",
    [
        (["compile"], "_orig_mod."),
        (["data_parallel"], "module."),
        (["compile", "data_parallel"], "module._orig_mod."),
    ],
)
def test_weights_saved_from_a_wrapped_module_are_refused_naming_the_prefix(
    wrappers: list[str], prefix: str
) -> None:
    """``init_from`` (eval, export, load) of weights a wrapper saved: the fix names the prefix to strip."""
    import torch

    from blocks.runtime.init import load_into

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    wrapped: torch.nn.Module = model
    for wrapper in wrappers:
        wrapped = torch.compile(wrapped) if wrapper == "compile" else torch.nn.DataParallel(wrapped)
    saved = wrapped.state_dict()
    with pytest.raises(BlocksError) as refused:
        load_into(model, saved, key="model.init_from", source="w.safetensors")
    problem = refused.value.problems[0]
    assert problem.check == "weights-fit" and "unexpected" in problem.message
    assert f"starts with '{prefix}'" in problem.fix and "model.init_from" in problem.fix
    unfit = {f"{prefix}extra.weight": torch.zeros(1), **saved}
    with pytest.raises(BlocksError) as other:
        load_into(model, unfit, key="model.init_from", source="w.safetensors")
    assert "starts with" not in other.value.problems[0].fix, "named only when stripping it fits"
