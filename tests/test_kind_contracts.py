"""The kind base classes are the contract: a block of another package that subclasses a base gets
the same treatment as a built-in, whatever its own fields are called."""

from __future__ import annotations

from dataclasses import dataclass

from blocks.core import jobs
from blocks.core.environment import Environment
from blocks.core.plan import make_plan
from blocks.data.base import BatchSpec, TokenBatch
from blocks.model.base import ModelBlock
from blocks.model.transformer import Transformer
from blocks.strategy.base import MeshShape

GPU = Environment(gpus=8, gpu_memory_bytes=80 * 2**30, host_memory_bytes=512 * 2**30)


@dataclass(frozen=True, kw_only=True)
class DeepNet(ModelBlock):
    """A third-party decoder whose repeated units are counted by ``depth`` (not ``n_layers``)."""

    accepts = (TokenBatch,)

    width: int = 128
    depth: int = 4
    context: int = 128

    def _same(self) -> Transformer:
        return Transformer(d_model=self.width, n_layers=self.depth, context=self.context)

    def num_parameters(self, spec: BatchSpec) -> int:
        """As the equivalent transformer."""
        return self._same().num_parameters(spec)

    def unit_parameters(self, spec: BatchSpec) -> int:
        """As the equivalent transformer."""
        return self._same().unit_parameters(spec)

    def activation_elements(self, spec: BatchSpec, micro_batch: int, *, checkpointing: bool) -> int:
        """As the equivalent transformer."""
        return self._same().activation_elements(spec, micro_batch, checkpointing=checkpointing)

    def shard_units(self) -> str:
        """Its blocks."""
        return "blocks"

    def unit_count(self) -> int:
        """``depth``."""
        return self.depth


def test_a_model_counting_its_units_as_depth_gets_the_transformers_memory_estimate() -> None:
    overrides = [
        "recipe=charlm",
        "strategy=fsdp",
        "trainer.devices=8",
        "model.d_model=256",
        "model.n_layers=12",
        "model.context=128",
    ]
    builtin = jobs.plan(overrides, GPU)
    assert isinstance(builtin.model, Transformer)
    third_party = make_plan(
        {**builtin.blocks, "model": DeepNet(width=256, depth=12, context=128)}, environment=GPU
    )
    assert builtin.derived.memory is not None and third_party.derived.memory is not None
    assert third_party.derived.memory == builtin.derived.memory
    assert builtin.derived.memory.sharded


def test_strategies_declare_their_memory_layout_and_mesh() -> None:
    plan = jobs.plan(
        ["recipe=charlm", "strategy=fsdp", "trainer.devices=8", "strategy.cpu_offload=true"], GPU
    )
    layout = plan.strategy.memory_layout()
    assert layout.shards_parameters and layout.cpu_offload
    assert plan.strategy.mesh(8) == MeshShape(shard=8)
    ddp = jobs.plan(["recipe=charlm", "strategy=ddp", "trainer.devices=8"], GPU).strategy
    assert not ddp.memory_layout().shards_parameters
    mesh = ddp.mesh(8)
    assert (mesh.replicate, mesh.data_parallel, mesh.world_size) == (8, 8, 8)


def test_every_list_of_kinds_is_derived_from_the_kind_table() -> None:
    import dataclasses
    import typing

    from blocks.core.catalog import BUILTIN_KINDS
    from blocks.core.compose import GROUP_DEFAULTS, GROUPS, primary_node
    from blocks.core.pipeline import RESERVED
    from blocks.core.plan import KIND_BASES
    from blocks.core.recipe import Recipe
    from blocks.spec.kinds import CROSS_KIND_GROUPS, KIND_TABLE, KINDS

    assert tuple(kind.name for kind in KIND_TABLE) == KINDS
    assert set(GROUPS) | {"hydra"} == RESERVED  # hparams_search was missing from the stage names
    assert "hparams_search" in RESERVED
    assert {kind.name: kind.default for kind in KIND_TABLE} == GROUP_DEFAULTS
    assert tuple(f"blocks.{kind}" for kind in KINDS) == BUILTIN_KINDS
    assert {kind.name: kind.base_class() for kind in KIND_TABLE} == KIND_BASES
    hints = typing.get_type_hints(Recipe)
    assert tuple(f.name for f in dataclasses.fields(Recipe)) == KINDS
    for kind in KIND_TABLE:
        assert kind.base_class() in typing.get_args(hints[kind.name]) or hints[kind.name] is kind.base_class()
    defaults = primary_node([])["defaults"]
    assert [next(iter(d)) for d in defaults if isinstance(d, dict)] == [*KINDS, *CROSS_KIND_GROUPS]


def test_no_layer_reads_a_block_field_by_name_with_a_default() -> None:
    """A field another layer reads is declared on the kind's base, so nothing needs ``getattr(block, "x", default)``."""
    import re
    from pathlib import Path

    pattern = re.compile(
        r"getattr\((plan\.\w+|ctx\.\w+(\([^)]*\))?|block|\w+_block|trainer|strategy|model|precision|monitor|checkpoint)"
        r"\s*,\s*[\"']"
    )
    package = Path(__file__).resolve().parents[1] / "blocks"
    found = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in package.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


def test_importing_blocks_imports_nothing_until_a_name_is_used() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, blocks\n"
        "print(sorted(m for m in sys.modules if m.startswith('blocks')))\n"
        "blocks.Plan\n"
        "print('blocks.model.base' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, env={"PYTHONPATH": str(root)}
    )
    assert out.stdout.split("\n")[:2] == ["['blocks']", "True"], out.stdout + out.stderr


def test_a_kind_added_by_one_table_entry_and_one_package_is_registered_and_planned() -> None:
    from blocks.core.compose import primary_node
    from blocks.spec.kinds import KIND_TABLE
    from blocks.spec.registry import Registry
    from tests.extra_kind import KIND
    from tests.extra_kind.base import CallbacksBlock, NoCallbacks

    table = (*KIND_TABLE, KIND)
    assert KIND.base_class() is CallbacksBlock
    registry = Registry(kinds=[kind.name for kind in table])
    registry.add(NoCallbacks, "none")
    assert registry.names("callbacks") == ["none"]
    assert {"callbacks": "none"} in primary_node([], table)["defaults"]

    builtin = jobs.plan(["recipe=charlm", "trainer.max_steps=5"], GPU)
    blocks = {**builtin.blocks, "callbacks": NoCallbacks(every_n_steps=50)}
    plan = make_plan(blocks, environment=GPU, kinds=table)
    assert plan.blocks["callbacks"] == NoCallbacks(every_n_steps=50)
    assert "callbacks.every_n_steps" in [p.key for p in plan.warnings]
    bad = make_plan({**blocks, "callbacks": NoCallbacks(every_n_steps=0)}, environment=GPU, kinds=table)
    assert "callbacks.every_n_steps" in [p.key for p in bad.errors]
