"""The spec layer: blocks, registry, recipes, composition and the plan (torch-free)."""
