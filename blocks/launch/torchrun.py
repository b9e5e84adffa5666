"""Starting workers through ``torch.distributed.run`` (torchrun): rendezvous, restarts, exit codes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from blocks.core.errors import BlocksError, Problem
from blocks.core.plan import Plan

RDZV_ENDPOINT_ENV = "BLOCKS_RDZV_ENDPOINT"
"""``host:port`` of the c10d rendezvous shared by the nodes of a multi-node job."""


def needs_launcher(plan: Plan) -> bool:
    """Several processes, or restarts after failures, need torchrun; one plain process does not."""
    return plan.derived.world_size > 1 or getattr(plan.trainer, "max_failures", 0) > 0


def torchrun_command(run_dir: Path, plan: Plan, environ: dict[str, str] | None = None) -> list[str]:
    """The torchrun command line that starts this node's workers for the run in *run_dir*.

    One node: ``--standalone`` (a local rendezvous on a free port, so jobs never collide).
    Several nodes: a c10d rendezvous at ``$BLOCKS_RDZV_ENDPOINT`` with the run dir as its id,
    so the same ``blocks run`` on every node forms one job.
    """
    environ = dict(os.environ if environ is None else environ)
    derived = plan.derived
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={derived.devices}",
        f"--max-restarts={getattr(plan.trainer, 'max_failures', 0)}",
    ]
    if derived.nodes == 1:
        command.append("--standalone")
    else:
        endpoint = environ.get(RDZV_ENDPOINT_ENV)
        if not endpoint:
            raise BlocksError(
                Problem(
                    "trainer.nodes",
                    f"trainer.nodes={derived.nodes} needs a rendezvous that every node can reach",
                    f"set {RDZV_ENDPOINT_ENV}=<host of node 0>:<free port> on every node and run the same "
                    "command with the same hydra.run.dir on each, or start workers with srun (see docs)",
                )
            )
        command += [
            f"--nnodes={derived.nodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id=blocks-{hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]}",
        ]
    return [*command, "-m", "blocks.launch.worker", str(run_dir)]


def torchrun_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for torchrun.

    Workers get their own TCPStore instead of sharing the rendezvous store: with the shared
    store, a restarted round can read the previous round's peer addresses and fail to connect
    (pytorch/pytorch#135712), which turns every restart into a second failure.
    """
    env = dict(os.environ if environ is None else environ)
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_torchrun(run_dir: Path, plan: Plan) -> int:
    """Run this node's workers under torchrun and return its exit status.

    SIGTERM and SIGINT sent to the driver alone (``kill``, a container runtime) are passed on
    to torchrun, which stops its workers gracefully, instead of orphaning them.
    """
    process = subprocess.Popen(torchrun_command(run_dir, plan), env=torchrun_environment())

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    on_main_thread = threading.current_thread() is threading.main_thread()
    signals = (signal.SIGTERM, signal.SIGINT) if on_main_thread else ()
    previous = {sig: signal.signal(sig, forward) for sig in signals}
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
