"""Starting workers through ``torch.distributed.run`` (torchrun): rendezvous, restarts, exit codes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import NamedTuple

from blocks.core.plan import Plan
from blocks.core.run_files import config_digest
from blocks.launch.collector import collection_paused
from blocks.launch.lifeline import children_environment, die_with_parent
from blocks.spec.errors import BlocksError, Problem

EXIT_INTERRUPTED = 130
"""The exit status of a job that SIGTERM or SIGINT stopped (after saving): ``blocks run`` exits with it too."""

RDZV_ENDPOINT_ENV = "BLOCKS_RDZV_ENDPOINT"
"""``host:port`` of the c10d rendezvous shared by the nodes of a multi-node job."""
RDZV_TIMEOUT_ENV = "BLOCKS_RDZV_TIMEOUT_S"
"""How long, in seconds, a node waits at the rendezvous for the other nodes before it gives up."""
RDZV_TIMEOUT_DEFAULT_S = 600
"""torchrun's own join timeout."""
STORE_TIMEOUT_S = 60
"""torchrun's timeout of an operation on the rendezvous store (reaching the first node's included)."""
EXIT_NO_RENDEZVOUS = 3
"""torchrun's status (never ``blocks run``'s) when the nodes did not all meet at the rendezvous."""


DRIVER_CONFIG_ENV = "BLOCKS_DRIVER_CONFIG"
"""The ``config.yaml`` text this node's driver wrote, for its workers to compare with every rank's."""
DRIVER_CONFIG_DIGEST_ENV = "BLOCKS_DRIVER_CONFIG_SHA256"
"""Its sha256 (:func:`~blocks.core.run_files.config_digest`): all that is passed of a text too long for a variable."""
DRIVER_CONFIG_MAX_CHARS = 64 * 1024
"""The longest text passed whole (Linux refuses an environment string over 128 KiB)."""


def needs_launcher(plan: Plan) -> bool:
    """Several processes, or restarts after failures, need torchrun; one plain process does not."""
    return plan.derived.world_size > 1 or plan.trainer.max_failures > 0


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
        "blocks.launch.torchrun_main",
        f"--nproc-per-node={derived.devices}",
        f"--max-restarts={plan.trainer.max_failures}",
        f"--shutdown-timeout={plan.trainer.shutdown_grace_s}",
        "--start-method=forkserver",
    ]
    if derived.nodes == 1:
        command.append("--standalone")
    else:
        endpoint, timeout = rendezvous_settings(plan, environ)
        command += [
            f"--nnodes={derived.nodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={rendezvous_id(run_dir)}",
            f"--rdzv-conf=join_timeout={timeout},read_timeout={min(timeout, STORE_TIMEOUT_S)}",
        ]
    return [*command, "-m", "blocks.launch.worker", str(run_dir)]


def rendezvous_id(run_dir: Path) -> str:
    """The c10d rendezvous id of a multi-node job in *run_dir*: the same on every node that names the same run dir."""
    return f"blocks-{hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]}"


def rendezvous_settings(plan: Plan, environ: dict[str, str] | None = None) -> tuple[str, int]:
    """The endpoint and timeout of a multi-node job's rendezvous, from the environment; refused when unusable.

    The driver checks them before it locks or writes anything (a bad value loses no record).
    """
    environ = dict(os.environ if environ is None else environ)
    endpoint = environ.get(RDZV_ENDPOINT_ENV)
    if not endpoint:
        raise BlocksError(
            Problem(
                "trainer.nodes",
                f"trainer.nodes={plan.derived.nodes} needs a rendezvous that every node can reach",
                f"set {RDZV_ENDPOINT_ENV}=<host of node 0>:<free port> on every node and run the same "
                "command with the same hydra.run.dir on each, or start workers with srun (see docs)",
            )
        )
    return endpoint, rendezvous_timeout(environ)


def rendezvous_timeout(environ: dict[str, str] | None = None) -> int:
    """Seconds a node waits at the rendezvous for the others: ``$BLOCKS_RDZV_TIMEOUT_S``, else torchrun's 600."""
    text = (os.environ if environ is None else environ).get(RDZV_TIMEOUT_ENV, "").strip()
    if not text:
        return RDZV_TIMEOUT_DEFAULT_S
    try:
        seconds = int(text)
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise BlocksError(
            Problem(
                RDZV_TIMEOUT_ENV,
                f"{RDZV_TIMEOUT_ENV}={text!r} is not a whole number of seconds above 0",
                f"set {RDZV_TIMEOUT_ENV} to how long a node may wait for the others (e.g. 600), or unset it",
            )
        )
    return seconds


def waiting_line(run_dir: Path, plan: Plan, environ: dict[str, str] | None = None) -> str:
    """What a multi-node driver prints as its torchrun waits for the other nodes at the rendezvous."""
    environ = dict(os.environ if environ is None else environ)
    return (
        f"blocks: waiting for {plan.derived.nodes} nodes at {environ.get(RDZV_ENDPOINT_ENV)} "
        f"(rendezvous_id {rendezvous_id(run_dir)}, gives up after {rendezvous_timeout(environ)} s: "
        f"{RDZV_TIMEOUT_ENV})"
    )


def no_rendezvous(plan: Plan, environ: dict[str, str] | None = None) -> str:
    """Why a multi-node job ended before training when its nodes never all met, and what to check."""
    environ = dict(os.environ if environ is None else environ)
    return (
        f"the {plan.derived.nodes} nodes did not all meet at the rendezvous at "
        f"{environ.get(RDZV_ENDPOINT_ENV)} within {rendezvous_timeout(environ)} s ({RDZV_TIMEOUT_ENV}), "
        "so nothing was trained: check the other nodes' output for an error that stopped them before "
        "they joined (a data path missing on one node, say), that every node ran the same command with "
        f"the same hydra.run.dir and {RDZV_ENDPOINT_ENV}, and that the endpoint's host and port are "
        f"reachable from every node; raise {RDZV_TIMEOUT_ENV} when the nodes start further apart"
    )


def multi_node_job(run_dir: Path, environ: dict[str, str] | None = None) -> str:
    """What names one multi-node job on every node: its rendezvous port and id.

    The nodes' drivers share their run dir's lock under it (:class:`~blocks.launch.lock.DirLock`).
    Not the endpoint's host: nodes may name the first node differently (``localhost`` on it, its
    full name or address on the others), while the port must be the same for them to meet.
    """
    endpoint = (os.environ if environ is None else environ).get(RDZV_ENDPOINT_ENV, "")
    port = endpoint.rpartition(":")[2] if ":" in endpoint else endpoint
    return f"port {port} {rendezvous_id(run_dir)}"


def torchrun_environment(
    plan: Plan, environ: dict[str, str] | None = None, config_text: str | None = None
) -> dict[str, str]:
    """The environment for torchrun.

    *config_text*, the ``config.yaml`` this node's driver wrote, is passed on to the workers
    (:data:`DRIVER_CONFIG_ENV`, its digest alone when it is long): they refuse to train when
    the ranks' configs differ, as they do when the nodes were started with different overrides.

    Workers get their own TCPStore instead of sharing the rendezvous store: with the shared
    store, a restarted round can read the previous round's peer addresses and fail to connect
    (pytorch/pytorch#135712), which turns every restart into a second failure. Several
    processes on a node get one torch thread each unless ``OMP_NUM_THREADS`` says otherwise,
    as torchrun would set it, but before torchrun starts: its forkserver imports torch first.
    """
    env = dict(os.environ if environ is None else environ)
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if plan.derived.devices > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    env.pop(DRIVER_CONFIG_ENV, None)
    env.pop(DRIVER_CONFIG_DIGEST_ENV, None)
    if config_text is not None:
        env[DRIVER_CONFIG_DIGEST_ENV] = config_digest(config_text)
        if len(config_text) <= DRIVER_CONFIG_MAX_CHARS:
            env[DRIVER_CONFIG_ENV] = config_text
    return children_environment(env)


class TorchrunExit(NamedTuple):
    """How torchrun ended: its exit *status* for ``blocks run``, and the *signal* passed on to it, if one was."""

    status: int
    signal: str | None = None


def run_torchrun(run_dir: Path, plan: Plan, config_text: str | None = None) -> TorchrunExit:
    """Run this node's workers under torchrun; how it ended.

    *config_text*: the ``config.yaml`` this driver wrote (:func:`torchrun_environment`).

    torchrun runs in a session of its own and dies with this process (so do its workers).
    SIGTERM and SIGINT reach it once, from here: the first is passed on (torchrun passes it
    to the workers, which save and stop together), a second one kills torchrun and its workers.
    A torchrun that the passed-on signal itself ended (it arrived while torchrun was starting,
    or waiting at the rendezvous for the other nodes, before it handles signals) was stopped
    on purpose too: the status is :data:`EXIT_INTERRUPTED`, not the signal's death.
    """
    on_main_thread = threading.current_thread() is threading.main_thread()
    command = torchrun_command(run_dir, plan)
    if plan.derived.nodes > 1:
        print(waiting_line(run_dir, plan), flush=True)
    process = subprocess.Popen(
        command,
        env=torchrun_environment(plan, config_text=config_text),
        start_new_session=on_main_thread,
    )
    forwarded: list[int] = []

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            if forwarded:
                process.kill()
            else:
                process.send_signal(signum)
        forwarded.append(signum)

    signals = (signal.SIGTERM, signal.SIGINT) if on_main_thread else ()
    previous = {sig: signal.signal(sig, forward) for sig in signals}
    try:
        status = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not forwarded:
        return TorchrunExit(status)
    name = signal.Signals(forwarded[0]).name
    if status in (-signal.SIGTERM, -signal.SIGINT):
        status = EXIT_INTERRUPTED
    return TorchrunExit(status, name)


def main(argv: list[str] | None = None) -> None:
    """``python -m blocks.launch.torchrun_main ARGS``: torchrun, dying with the driver, forking preloaded workers.

    The arguments are torchrun's, ending in ``-m blocks.launch.worker RUN_DIR``; the workers
    are :func:`~blocks.launch.worker.forked_worker` for RUN_DIR, forked from a forkserver that
    imported torch and Lightning once (``--start-method``), so neither a start nor a restart
    pays for the imports again.

    A signal that stopped the job exits with the interrupted status (130): the first SIGTERM
    or SIGINT is passed on to the workers, which get ``--shutdown-timeout`` seconds to save and
    end; later ones are dropped (one signal sent to every process of the job reaches torchrun
    twice, directly and from the driver). Failed workers
    exit 1 with torchrun's account of which rank failed how (with the worker's traceback when
    it raised), and no traceback of torchrun's own.
    """
    # Until torchrun handles signals (as it starts the workers), SIGINT ends it at once, as SIGTERM
    # does: a KeyboardInterrupt would wait for the rendezvous's C++ call to return, for minutes.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if not die_with_parent():
        os._exit(1)  # an orphan: the driver that started it is gone
    os.environ.update(children_environment({}))
    start_forkserver()

    with collection_paused():
        from omegaconf import OmegaConf
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.elastic.rendezvous.api import (
            RendezvousClosedError,
            RendezvousConnectionError,
            RendezvousTimeoutError,
        )
        from torch.distributed.launcher.api import elastic_launch
        from torch.distributed.run import config_from_args, get_args_parser

        from blocks.compat.elastic_private import stop_on_the_first_signal_only
        from blocks.core.masking import hide_environment_values, hiding_output
        from blocks.core.run_files import CONFIG_FILE
        from blocks.launch.worker import forked_worker

    args = get_args_parser().parse_args(argv)
    if args.standalone:  # what torchrun's own ``run`` does for --standalone
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    run_dir = Path(args.training_script_args[-1])
    config, _, _ = config_from_args(args)
    logging.getLogger(ELASTIC_PROCESSES_LOGGER).addFilter(_without_traceback)
    stop_on_the_first_signal_only()  # a whole job signalled: its own SIGTERM and the driver's
    # torchrun's failure account quotes the workers' errors
    hide_environment_values(OmegaConf.load(run_dir / CONFIG_FILE))  # type: ignore[arg-type]
    with hiding_output():
        try:
            elastic_launch(config, entrypoint=forked_worker)(str(run_dir))
        except SignalException as exc:
            print(f"blocks: torchrun stopped its workers on {exc.sigval.name}", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)
        except ChildFailedError as exc:
            write_failures(run_dir, exc)
            print(exc.format_msg(), file=sys.stderr, flush=True)
            sys.exit(1)
        except (RendezvousTimeoutError, RendezvousConnectionError, RendezvousClosedError) as exc:
            # the driver explains it (no_rendezvous); torch's own words say which wait ended
            said = ": ".join(str(e) for e in (exc, exc.__cause__) if e is not None and str(e))
            print(
                f"blocks: torchrun gave up at the rendezvous ({type(exc).__name__}{': ' + said if said else ''})",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(EXIT_NO_RENDEZVOUS)


def start_forkserver() -> None:
    """Start the forkserver the workers fork from, preloading :mod:`blocks.launch.forkserver`.

    Called first thing, from the main thread (the server dies with the thread that started
    it), before this process imports torch: the server's imports of torch and Lightning
    overlap torchrun's own and the rendezvous. The server's environment is this process's
    now, so ``OMP_NUM_THREADS`` must already be set (:func:`torchrun_environment`).
    """
    import multiprocessing.forkserver

    multiprocessing.set_forkserver_preload(["blocks.launch.forkserver"])
    multiprocessing.forkserver.ensure_running()


ELASTIC_PROCESSES_LOGGER = "torch.distributed.elastic.multiprocessing.api"
"""The logger of torchrun's worker processes: on a failure it logs the traceback of its own wait."""


def _without_traceback(record: logging.LogRecord) -> bool:
    """Keep the message, drop the traceback: torchrun's failure account shows the worker's own one."""
    record.exc_info, record.exc_text = None, None
    return True


FAILURES_FILE = ".torchrun-failures.json"
"""torchrun's record of the workers that failed in the last attempt (global rank, exit code, signal)."""


def write_failures(run_dir: Path, error: object) -> None:
    """Record which ranks failed how, for the driver's failure summary."""
    failures = getattr(error, "failures", {})
    records = [
        {"rank": rank, "local_rank": f.local_rank, "exitcode": f.exitcode, "signal": f.signal_name()}
        for rank, f in sorted(failures.items())
    ]
    with contextlib.suppress(OSError):
        (run_dir / FAILURES_FILE).write_text(json.dumps(records))


def read_failures(run_dir: Path) -> list[dict[str, object]]:
    """What :func:`write_failures` recorded for *run_dir* (empty when nothing failed)."""
    try:
        data = json.loads((run_dir / FAILURES_FILE).read_text())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []
