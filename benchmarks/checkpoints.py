"""Checkpoints: blocks' committed save vs ``torch.save``; the stall of ``async_save``; resume vs ``torch.load``.

The state is what Lightning hands a checkpoint IO plugin: a model's ``state_dict``, its AdamW
state after one step, and loop counters. Everything goes to the same local file system; each
case runs once unmeasured first (the first save allocates host buffers), then the cases take
turns round by round and each figure is the median of the per-round ratios. The details
carry a profile: one hash pass over the saved file with each digest algorithm a manifest may name
(XXH3-128, BLAKE3, sha256), to explain what a save or a resume pays on top of ``torch.save``/``torch.load``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import Figure, interleaved, judged, median_ratio, rounded


def training_state(parameters: int) -> dict[str, Any]:
    """A checkpoint dict with about *parameters* float32 weights plus AdamW's two moments."""
    import torch
    from torch import nn

    width = 1024
    model = nn.Sequential(*(nn.Linear(width, width) for _ in range(max(1, parameters // (width * width)))))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, width)).sum().backward()
    optimizer.step()
    return {
        "state_dict": model.state_dict(),
        "optimizer_states": [optimizer.state_dict()],
        "loops": {"fit_loop": {"epoch": 0, "step": 1}},
        "global_step": 1,
    }


def run(quick: bool, root: Path) -> list[Figure]:
    """Sync save vs torch.save, async stall vs sync save, verified resume vs torch.load."""
    import torch
    from fsspec.core import url_to_fs

    from blocks.checkpoint import store
    from blocks.checkpoint.io import FsspecCheckpointIO

    state = training_state(4_000_000 if quick else 25_000_000)
    manifest = store.Manifest(step=1, epoch=0, world_size=1, sharded=False, global_batch=1, block_digests={})
    sync_io, async_io = FsspecCheckpointIO(), FsspecCheckpointIO(async_save=True)
    sync_io.pending_manifest = async_io.pending_manifest = manifest
    last: dict[str, str] = {}

    def fresh(name: str) -> str:
        last[name] = tempfile.mkdtemp(dir=root)
        return last[name]

    def torch_save() -> float:
        started = time.perf_counter()
        torch.save(state, Path(fresh("torch")) / "state.pt")
        return time.perf_counter() - started

    def blocks_save() -> float:
        started = time.perf_counter()
        sync_io.save_checkpoint(state, fresh("blocks"))
        return time.perf_counter() - started

    def blocks_async_stall() -> float:
        started = time.perf_counter()
        async_io.save_checkpoint(state, fresh("async"))
        stall = time.perf_counter() - started
        async_io.wait()
        return stall

    def torch_load() -> float:
        started = time.perf_counter()
        torch.load(Path(last["blocks"]) / "state.pt", weights_only=True)  # the same file blocks loads
        return time.perf_counter() - started

    def blocks_load() -> float:
        store._VERIFIED.clear()  # as in a fresh process: each resume hashes its files once
        started = time.perf_counter()
        sync_io.load_checkpoint(last["blocks"])
        return time.perf_counter() - started

    def hash_pass(algorithm: str) -> Callable[[], float]:
        def run() -> float:
            fs, path = url_to_fs(str(Path(last["blocks"]) / "state.pt"))
            started = time.perf_counter()
            store.file_digest(fs, path, algorithm)
            return time.perf_counter() - started

        return run

    repeats = 5 if quick else 7
    save_cases = {"torch": torch_save, "blocks": blocks_save, "async": blocks_async_stall}
    first_stall = blocks_async_stall()
    for case in save_cases.values():
        case()
    saves = interleaved(save_cases, repeats)
    load_cases = {"torch": torch_load, "blocks": blocks_load}
    for case in load_cases.values():
        case()
    loads = interleaved(load_cases, repeats)
    hashes = interleaved({name: hash_pass(name) for name in store.DIGEST_HEX_LENGTHS}, repeats)
    async_io.teardown()
    size_mb = (Path(last["torch"]) / "state.pt").stat().st_size / 2**20
    profile = {f"{name}_pass_s": round(statistics.median(values), 3) for name, values in hashes.items()}
    return [
        judged(
            "checkpoints",
            f"sync save (write, {store.HASH}, manifest) / torch.save, {size_mb:.0f} MB",
            median_ratio(saves["blocks"], saves["torch"]),
            "<= 1.1",
            **rounded(saves, 3, "_save_s"),
            **profile,
        ),
        judged(
            "checkpoints",
            "async_save: training stall / sync save",
            median_ratio(saves["async"], saves["blocks"]),
            "<= 0.2",
            first_stall_s=round(first_stall, 3),
        ),
        judged(
            "checkpoints",
            f"resume: verified load ({store.HASH} hashed once, beside the load) / torch.load",
            median_ratio(loads["blocks"], loads["torch"]),
            "<= 1.2",
            **rounded(loads, 3, "_load_s"),
            **profile,
        ),
    ]
