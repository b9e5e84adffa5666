"""The Acme team's conformance tests: blocks' kit (the ``blocks_kit`` fixture) on each of our blocks."""

from blocks.testing import Kit


def test_resnet_mlp_conforms(blocks_kit: Kit) -> None:
    blocks_kit.check_block("model", "acme/resnet_mlp")


def test_orchids_conforms(blocks_kit: Kit) -> None:
    blocks_kit.check_block("data", "acme/orchids", ddp=False)
