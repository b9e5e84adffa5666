"""Measured costs of ``blocks`` against plain Lightning and plain PyTorch (``python -m benchmarks``).

Every figure is a ratio of two things measured side by side in the same process run, in
interleaved repetitions, reported as the median: absolute times on shared machines drift,
ratios measured together do not (much).
"""
