"""Streaming data: ``data=stream`` from local shards and from an S3-protocol server vs in-memory ``data=text``.

All three train the same decoder on the byte-level tokens of Python's ``email`` sources. The
figure per case is the data wait per optimizer step as a share of the step time
(``data_wait_s / step_time_s``, medians over the ``metrics.csv`` rows after the first). The
S3 case reads from moto's standalone server on loopback through a cold cache.
"""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.distributed import THREADS, blocks_overrides
from benchmarks.harness import Figure, judged, python

TARGET = "<= 0.05"


@contextlib.contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """The moto S3 server on a free loopback port, and the environment that points s3fs at it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        yield env
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_share(extra: list[str], steps: int, root: Path, env: dict[str, str]) -> dict[str, float]:
    """Median data wait, step time and their ratio of one ``blocks run``."""
    run_dir = Path(tempfile.mkdtemp(dir=root))
    base = [o for o in blocks_overrides(steps) if not o.startswith("data.level=")]
    args = python("-m", "blocks", "run", *base, *extra, f"hydra.run.dir={run_dir}")
    proc = subprocess.run(
        args, cwd=root, capture_output=True, text=True, env={**os.environ, **THREADS, **env}
    )
    if proc.returncode != 0:
        raise RuntimeError(f"blocks run failed:\n{proc.stderr[-3000:]}")
    with (run_dir / "metrics.csv").open() as fh:
        rows = [row for row in csv.DictReader(fh) if row.get("step_time_s")][1:]
    wait = statistics.median(float(r["data_wait_s"]) for r in rows)
    step = statistics.median(float(r["step_time_s"]) for r in rows)
    return {"data_wait_s": round(wait, 6), "step_time_s": round(step, 5), "share": wait / step}


def _prepare(out: str, env: dict[str, str]) -> None:
    command = python("-m", "blocks", "data", "prepare", "python:email", out, "--shard-tokens", "65536")
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, **env})


def run(quick: bool, root: Path) -> list[Figure]:
    """Data wait share of the step for in-memory text, local shards and shards on an S3 server."""
    steps = 60 if quick else 300
    local = str(root / "shards")
    _prepare(local, {})
    same = ["data.seq_len=64"]
    cases: dict[str, tuple[list[str], dict[str, str]]] = {
        "data=text (in memory)": (["data=text", "data.level=byte", *same], {}),
        "data=stream, local shards": (["data=stream", f"data.path={local}", *same], {}),
    }
    figures: list[Figure] = []
    with s3_server() as env:
        import s3fs

        s3fs.S3FileSystem(
            key=env["AWS_ACCESS_KEY_ID"],
            secret=env["AWS_SECRET_ACCESS_KEY"],
            endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"],
        ).mkdir("bench")
        _prepare("s3://bench/shards", env)
        cache = str(root / "cache")
        cases["data=stream, S3 server, cold cache"] = (
            ["data=stream", "data.path=s3://bench/shards", f"data.cache_dir={cache}", *same],
            env,
        )
        for name, (extra, case_env) in cases.items():
            measured = wait_share(extra, steps, root, case_env)
            figures.append(
                judged(
                    "streaming",
                    f"data wait / step time, {name}",
                    round(measured["share"], 4),
                    TARGET,
                    data_wait_s=measured["data_wait_s"],
                    step_time_s=measured["step_time_s"],
                    steps=steps,
                )
            )
    return figures
