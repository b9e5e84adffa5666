"""Acme's tabular blocks: ``data=acme/orchids`` and ``model=acme/resnet_mlp``.

Importing this module registers them; ``blocks`` imports it inside the ``acme`` namespace
because of the package's entry point.
"""

from acme_tabular.blocks import Orchids, ResidualMLP
from acme_tabular.recipes import orchids

BLOCKS_API = 1
"""The block API this package targets (``blocks.core.packages.API_VERSION``)."""

__all__ = ["BLOCKS_API", "Orchids", "ResidualMLP", "orchids"]
