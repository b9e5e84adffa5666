"""The one seam to the private APIs of torch, Lightning, Hydra and OmegaConf that have no public twin.

Everything in this package reaches into another project's internals (an underscore name, an
internal module, an undocumented attribute path, the wording of an error message). Nothing
else in ``blocks`` may (``tests/test_compat.py`` greps for it), and that test pins the
behaviour each helper relies on, so an upgrade that changes one fails one test instead of a
user's job.

One module per layer: :mod:`blocks.compat.hydra_private` is torch-free (the spec layer
composes configs with it); :mod:`blocks.compat.torch_private` imports torch and Lightning
(the build and checkpoint code use it); :mod:`blocks.compat.dcp_private` holds
torch.distributed.checkpoint's, imported only by sharded checkpoints;
:mod:`blocks.compat.elastic_private` holds torchrun's, imported only by torchrun's process.
"""
