"""blocks' Ray launcher for Hydra, where Hydra looks for plugins (``hydra/launcher=ray``)."""
