"""The spec base: the block base class, errors, the kind table and the registry.

The lowest layer of blocks: it imports no block kind, no torch, no Hydra. Every kind's
base class builds on it; the plan, recipes and catalog sit above the kinds.
"""
