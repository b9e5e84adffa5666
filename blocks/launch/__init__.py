"""The launch layer: the driver, run dirs and workers."""
