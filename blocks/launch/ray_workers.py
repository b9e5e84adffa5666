"""Starting a job's workers on a Ray cluster (``trainer.launcher=ray``).

One Ray actor per worker, placed by a placement group with one bundle per node
(``trainer.devices`` workers' resources each, spread over ``trainer.nodes`` nodes). Each actor
starts the same worker entry point torchrun starts (``python -m blocks.launch.worker RUN_DIR``)
with torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...), so
the workers read the frozen run dir and write the same files. A failed attempt is retried up to
``trainer.max_failures`` times on fresh actors; the workers resume from blocks' own committed
checkpoints, as under torchrun.

``RAY_ADDRESS`` selects the cluster; without it a local Ray instance is started. ``ray`` is
imported only here, when the backend is chosen.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blocks.core.launcher import ray_missing
from blocks.launch.lifeline import PARENT_ENV
from blocks.launch.torchrun import EXIT_INTERRUPTED, FAILURES_FILE
from blocks.spec.errors import BlocksError, Problem

if TYPE_CHECKING:
    from blocks.core.plan import Plan

RAY = "ray"
"""The ``trainer.launcher`` value that chooses this backend."""

ADDRESS_ENV = "RAY_ADDRESS"
IN_RAY_TASK_ENV = "BLOCKS_IN_RAY_TASK"
"""Set by the Ray sweep launcher: the driver runs inside a Ray task (Ray owns the signals there)."""

FORWARDED_ENV_PREFIXES = ("BLOCKS_", "FSSPEC_", "AWS_", "HF_", "TORCH_", "NCCL_", "GLOO_", "PYTHONPATH")
"""Driver environment the workers get (the rest is the node's own, as Ray starts it)."""

PLACEMENT_TIMEOUT_S = 300.0
POLL_S = 0.5


def uses_ray(plan: Plan) -> bool:
    """Whether the plan's ``trainer.launcher`` chooses Ray."""
    return plan.trainer.launcher == RAY


def worker_resources(plan: Plan) -> dict[str, float]:
    """Ray resources of one worker: a CPU plus its data loader processes, and a GPU on GPU jobs."""
    resources = {"CPU": float(1 + plan.data.num_workers)}
    if plan.derived.accelerator == "gpu":
        resources["GPU"] = 1.0
    return resources


def node_bundle(plan: Plan) -> dict[str, float]:
    """Resources one node of the job needs: ``trainer.devices`` workers'."""
    return {name: amount * plan.derived.devices for name, amount in worker_resources(plan).items()}


def placement_problems(plan: Plan, nodes: list[dict[str, float]]) -> list[Problem]:
    """Why a cluster whose live nodes have *nodes* resources cannot place the job (empty when it can)."""
    bundle = node_bundle(plan)
    fitting = [n for n in nodes if all(n.get(name, 0.0) >= amount for name, amount in bundle.items())]
    if len(fitting) >= plan.derived.nodes:
        return []
    have = "; ".join(
        ", ".join(f"{k}={v:g}" for k, v in sorted(n.items()) if k in ("CPU", "GPU")) or "nothing"
        for n in nodes
    )
    wanted = ", ".join(f"{k}={v:g}" for k, v in sorted(bundle.items()))
    key = "trainer.nodes" if plan.derived.nodes > 1 and len(fitting) >= 1 else "trainer.devices"
    return [
        Problem(
            key,
            f"the Ray cluster cannot place this job: it needs {plan.derived.nodes} node(s) with {wanted} each "
            f"(trainer.devices={plan.derived.devices} workers of {_describe(worker_resources(plan))}), but "
            f"only {len(fitting)} of its {len(nodes)} live node(s) have that (nodes: {have or 'none'})",
            "add nodes or resources to the cluster, or lower trainer.devices/trainer.nodes "
            "(data.num_workers counts as CPUs per worker)",
            check="ray-placement",
            related=("trainer.devices", "trainer.nodes", "trainer.launcher"),
        )
    ]


def _describe(resources: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(resources.items()))


def _import_ray() -> Any:
    missing = ray_missing("trainer.launcher", "pip install 'blocks[ray]' (or trainer.launcher=torchrun)")
    if missing:
        raise BlocksError(missing)
    import ray

    return ray


def connect(plan: Plan) -> Any:
    """Connect to the cluster at ``$RAY_ADDRESS`` (or start a local Ray instance) once per process; returns ``ray``."""
    ray = _import_ray()
    if ray.is_initialized():
        return ray
    address = os.environ.get(ADDRESS_ENV)
    try:
        with warnings.catch_warnings():
            # Ray's notice about a future change to CUDA_VISIBLE_DEVICES for CPU-only actors
            warnings.simplefilter("ignore", FutureWarning)
            if address:
                ray.init(address=address, logging_level="warning", log_to_driver=True)
            else:
                needed = int(node_bundle(plan)["CPU"])
                ray.init(
                    address="local",
                    num_cpus=max(os.cpu_count() or 1, needed),
                    include_dashboard=False,
                    logging_level="warning",
                )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BlocksError(
            Problem(
                "trainer.launcher",
                f"is 'ray', but the Ray cluster at {ADDRESS_ENV}={address} cannot be reached ({exc})",
                f"start it (`ray start --head`), fix {ADDRESS_ENV}, or unset it to start a local Ray instance",
                check="ray-placement",
            )
        ) from None
    return ray


def preflight(plan: Plan) -> None:
    """Refuse a job the Ray cluster cannot place, before anything is written or started."""
    ray = connect(plan)
    nodes = [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive")]
    problems = placement_problems(plan, nodes)
    if problems:
        raise BlocksError(problems)


class WorkerProcess:
    """A Ray actor that runs one worker process of the job (``python -m blocks.launch.worker``)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None

    def node(self) -> tuple[str, list[str]]:
        """The node IP address of this actor and the GPU ids Ray gave it."""
        import ray

        gpus = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
        return ray.util.get_node_ip_address(), [str(g) for g in gpus]

    def free_port(self) -> int:
        """A TCP port free on this node right now (for the process group's store)."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def start(self, command: list[str], env: dict[str, str], cwd: str) -> int:
        """Start the worker process; it dies with this actor. Returns its pid."""
        self.process = subprocess.Popen(
            command,
            env={**os.environ, **env, PARENT_ENV: str(os.getpid())},
            cwd=cwd if Path(cwd).is_dir() else None,
        )
        return self.process.pid

    def poll(self) -> int | None:
        """The worker's exit status, or None while it runs."""
        return None if self.process is None else self.process.poll()

    def send(self, signum: int) -> None:
        """Pass a signal to the worker (SIGTERM: save and stop)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def kill(self) -> None:
        """Kill the worker and reap it."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait()


@dataclass
class Signals:
    """SIGTERM/SIGINT received by a driver: the first asks its work to stop and save, a second ends it at once.

    In a Ray task (a job of a ``hydra/launcher=ray`` sweep) only SIGINT is taken: it is how
    ``ray.cancel`` stops the task (the sweep's driver stopping its jobs), and SIGTERM stays Ray's.
    """

    received: list[int] = field(default_factory=list)
    previous: dict[int, Any] = field(default_factory=dict)

    def install(self) -> None:
        """Record the signals from now on (from the main thread only, where Python runs handlers)."""
        if threading.current_thread() is not threading.main_thread():
            return
        taken = (signal.SIGINT,) if os.environ.get(IN_RAY_TASK_ENV) else (signal.SIGTERM, signal.SIGINT)
        for sig in taken:
            self.previous[sig] = signal.signal(sig, self._record)

    def take_back(self) -> None:
        """Record the signals again after code that replaced the handlers (``ray.init`` takes SIGTERM); :meth:`restore` is unchanged."""
        for sig in self.previous:
            signal.signal(sig, self._record)

    def _record(self, signum: int, frame: object) -> None:
        self.received.append(signum)

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def run_ray(run_dir: Path, plan: Plan) -> int:
    """Run the job's workers on Ray, restarting them up to ``trainer.max_failures`` times; returns an exit status.

    0 when every worker exited 0, 130 when a signal stopped the job, 1 when the last attempt failed.
    """
    ray = connect(plan)
    max_failures = plan.trainer.max_failures
    signals = Signals()
    signals.install()
    try:
        attempt = 0
        while True:
            failures = _attempt(ray, run_dir, plan, attempt, signals)
            if signals.received:
                return EXIT_INTERRUPTED
            if not failures:
                return 0
            with contextlib.suppress(OSError):
                (run_dir / FAILURES_FILE).write_text(json.dumps(failures))
            if attempt >= max_failures:
                print(f"blocks: Ray workers failed: {_render(failures)}", file=sys.stderr, flush=True)
                return 1
            attempt += 1
            print(
                f"blocks: Ray workers failed ({_render(failures)}); restart {attempt} of {max_failures}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        signals.restore()


def _render(failures: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"rank {f['rank']} " + (f"died ({f['signal']})" if f.get("signal") else f"exited {f['exitcode']}")
        for f in failures
    )


def _attempt(ray: Any, run_dir: Path, plan: Plan, attempt: int, signals: Signals) -> list[dict[str, Any]]:
    """One attempt on fresh actors; the failures of the workers that failed first (empty on success)."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    derived = plan.derived
    nodes, devices = derived.nodes, derived.devices
    group = placement_group([node_bundle(plan)] * nodes, strategy="STRICT_SPREAD" if nodes > 1 else "PACK")
    actors: list[Any] = []
    try:
        try:
            ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise BlocksError(
                Problem(
                    "trainer.devices",
                    f"the Ray cluster did not place the job's {nodes}×{devices} workers "
                    f"({_describe(worker_resources(plan))} each) within {PLACEMENT_TIMEOUT_S:g}s",
                    "free or add cluster resources, or lower trainer.devices/trainer.nodes",
                    check="ray-placement",
                )
            ) from None
        resources = worker_resources(plan)
        remote = ray.remote(WorkerProcess)
        for rank in range(nodes * devices):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank // devices)
            actors.append(
                remote.options(
                    num_cpus=resources["CPU"], num_gpus=resources.get("GPU", 0), scheduling_strategy=strategy
                ).remote()
            )
        placed = ray.get([actor.node.remote() for actor in actors])
        master_addr = placed[0][0]
        master_port = ray.get(actors[0].free_port.remote())
        job_id = "blocks-ray-" + hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
        forwarded = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
        command = [sys.executable, "-m", "blocks.launch.worker", str(run_dir.resolve())]
        for rank, actor in enumerate(actors):
            node_rank, local_rank = divmod(rank, devices)
            env = {
                **forwarded,
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "GROUP_RANK": str(node_rank),
                "NODE_RANK": str(node_rank),
                "ROLE_RANK": str(rank),
                "WORLD_SIZE": str(nodes * devices),
                "LOCAL_WORLD_SIZE": str(devices),
                "ROLE_WORLD_SIZE": str(nodes * devices),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "TORCHELASTIC_RUN_ID": job_id,
                "TORCHELASTIC_RESTART_COUNT": str(attempt),
                "TORCHELASTIC_MAX_RESTARTS": str(plan.trainer.max_failures),
                "PYTHONUNBUFFERED": "1",
            }
            # LOCAL_RANK indexes the node's visible GPUs: every worker of a node sees the node's GPUs in rank order.
            node_gpus = [g for r, (_, ids) in enumerate(placed) if r // devices == node_rank for g in ids]
            if node_gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(node_gpus)
            ray.get(actor.start.remote(command, env, os.getcwd()))
        return _watch(ray, actors, devices, signals, plan.trainer.shutdown_grace_s)
    finally:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.get(actor.kill.remote(), timeout=30)
            with contextlib.suppress(Exception):
                ray.kill(actor)
        with contextlib.suppress(Exception):
            remove_placement_group(group)


def _watch(
    ray: Any, actors: list[Any], devices: int, signals: Signals, grace_s: float
) -> list[dict[str, Any]]:
    """Wait for the workers; pass on signals; on the first failure kill the others and return who failed.

    As torchrun's ``--shutdown-timeout``: workers still running *grace_s* seconds after the
    SIGTERM passed on (a rank wedged where it can neither save nor end itself) are killed.
    """
    passed_on = 0
    overdue_at: float | None = None
    while True:
        if len(signals.received) > passed_on:
            signum = signal.SIGKILL if passed_on else signal.SIGTERM
            for actor in actors:
                actor.send.remote(int(signum))
            passed_on = len(signals.received)
            overdue_at = time.monotonic() + grace_s if signum == signal.SIGTERM else None
        try:
            codes = ray.get([actor.poll.remote() for actor in actors])
        except ray.exceptions.RayActorError as exc:
            return [{"rank": -1, "local_rank": -1, "exitcode": -1, "signal": f"Ray actor lost: {exc}"[:300]}]
        failed = [
            {
                "rank": rank,
                "local_rank": rank % devices,
                "exitcode": code,
                "signal": signal.Signals(-code).name if code < 0 else None,
            }
            for rank, code in enumerate(codes)
            if code not in (None, 0)
        ]
        if failed:
            return failed
        if all(code == 0 for code in codes):
            return []
        if overdue_at is not None and time.monotonic() >= overdue_at:
            _kill_overdue(actors, codes, signals.received[0], grace_s)
            overdue_at = None
        time.sleep(POLL_S)


def _kill_overdue(actors: list[Any], codes: list[int | None], signum: int, grace_s: float) -> None:
    """Kill the workers still running (exit status *codes* None) *grace_s* seconds after *signum*, naming their ranks."""
    running = [rank for rank, code in enumerate(codes) if code is None]
    print(
        f"blocks: rank {', '.join(map(str, running))} still running {grace_s:g}s after "
        f"{signal.Signals(signum).name} (trainer.shutdown_grace_s={grace_s:g}); killing it",
        file=sys.stderr,
        flush=True,
    )
    for rank in running:
        actors[rank].send.remote(int(signal.SIGKILL))
