"""Nothing a config, a preset or a checkpoint says can run code (issue 13).

A corpus of gadget paths (functions and classes that run commands, code or pickles, and
aliases of them in a user module) is driven through every field that names code by import
path, through a YAML preset and through Hydra's own ``hydra.callbacks``: ``blocks run`` exits
2 before a run dir exists, with no traceback, and the marker file the gadget would write is
never written. Most cases run ``blocks run`` in this process (its real entry point, refused
before Hydra starts); a handful run as subprocesses. Crafted full and sharded checkpoints
(a ``__reduce__`` payload) are refused by every loader.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from blocks.cli.main import main
from blocks.spec.errors import ConfigError
from blocks.spec.imports import resolve
from tests.conftest import read_summary, run_cli, run_in_process

pytestmark = pytest.mark.timeout(900)

GADGETS = [
    "os.system",
    "os.popen",
    "os.execv",
    "posix.system",
    "subprocess.Popen",
    "subprocess.run",
    "subprocess.check_output",
    "subprocess.getoutput",
    "pty.spawn",
    "torch.utils.collect_env.run",
    "torch.utils.collect_env.run_and_read_all",
    "torch.hub.load",
    "torch.load",
    "torch.jit.load",
    "pickle.loads",
    "builtins.exec",
    "builtins.eval",
    "builtins.__import__",
    "builtins.open",
    "importlib.import_module",
    "importlib.util.spec_from_file_location",
    "runpy.run_path",
    "runpy.run_module",
    "shutil.rmtree",
    "ctypes.CDLL",
    "code.interact",
    "webbrowser.open",
    "multiprocessing.Process",
    "asyncio.create_subprocess_shell",
    "functools.partial",
    "operator.methodcaller",
    "hydra.utils.call",
    "hydra.utils.instantiate",
    "timeit.timeit",
    "numpy.load",
    "yaml.unsafe_load",
    "pdb.run",
    "imaplib.IMAP4_stream",  # runs its argument as a shell command when constructed
    "tests.legacy_team.launch",  # = os.system in a user module
    "tests.legacy_team.Shell",  # = subprocess.Popen in a user module
]
"""Import paths that would run a command, code or a pickle if a config could call them."""

ALLOW_ALL_TOPS = ",".join(sorted({g.split(".")[0] for g in GADGETS}))
"""The user allows every gadget's top-level package: the deny-list and the kind checks still refuse."""

ADAPTED = ["recipe=blobs", "debug=fast", "model=torch_module"]
SPEC_ARGS = "+model.spec_args={in_features:num_features,num_classes:num_classes}"
DATAMODULE = [
    "data=lightning_data",
    "data.num_features=8",
    "data.num_classes=3",
    "data.train_samples=192",
    "data.val_samples=64",
]


ALIASES = ["tests.legacy_team.launch", "tests.legacy_team.Shell"]
"""Gadgets that pass the string check (their module is allowed) and are refused by what they really are."""


def field_overrides(field: str, gadget: str, marker: Path) -> list[str]:
    """Overrides that put *gadget* in *field*, armed with arguments that would write *marker*."""
    command = f"'touch {marker}'"
    return {
        "model.target": [f"model.target={gadget}", f"+model.kwargs.command={command}"],
        "data.target": [f"data.target={gadget}", f"+data.kwargs.command={command}"],
        "model.kwargs._target_": [f"+model.kwargs.act={{_target_:{gadget},command:{command}}}"],
        "monitor.loggers": [f"monitor.loggers=[csv,{gadget}]", f"+monitor.logger_args.command={command}"],
        "hydra.callbacks": [
            f"+hydra.callbacks.evil._target_={gadget}",
            f"+hydra.callbacks.evil.command={command}",
        ],
    }[field]


BASE = [
    "recipe=blobs",
    "debug=fast",
    "model=torch_module",
    SPEC_ARGS,
    "model.target=tests.legacy_team.TinyNet",
    *DATAMODULE,
    "data.target=tests.legacy_team.ClustersDM",
]
"""A job whose model and data are adapters of legitimate user code (tests.legacy_team)."""


def base_for(fields: list[str]) -> list[str]:
    """:data:`BASE` without the overrides of *fields* (each is set once, by the case)."""
    return [o for o in BASE if o.split("=", 1)[0] not in fields]


FIELDS = {
    "model.target": "model.target",
    "data.target": "data.target",
    "model.kwargs._target_": "model.kwargs.act._target_",
    "monitor.loggers": "monitor.loggers",
    "hydra.callbacks": "hydra.callbacks.evil._target_",
}
"""Each import-path field, and the key its refusal names."""


def run_here(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``blocks run ARGS`` through the real entry point in this process: its exit code and output."""
    with pytest.raises(SystemExit) as exited:
        main(["run", *args])
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out + captured.err


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory whose user allows every gadget's top-level package."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", ALLOW_ALL_TOPS)
    return tmp_path


def assert_refused(code: int, output: str, marker: Path, run_dir: Path) -> None:
    assert code == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert not marker.exists(), "the gadget ran"
    assert not run_dir.exists(), "a run dir was created before the refusal"


@pytest.mark.parametrize("gadget", [g for g in GADGETS if g not in ALIASES])
def test_every_gadget_is_refused_in_every_import_path_field(
    gadget: str, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One command puts the gadget in every field at once; each field's refusal is reported."""
    marker, run_dir = project / "pwned", project / "run"
    args = [*base_for(list(FIELDS)), *(o for field in FIELDS for o in field_overrides(field, gadget, marker))]
    code, output = run_here([*args, f"hydra.run.dir={run_dir}"], capsys)
    assert_refused(code, output, marker, run_dir)
    flat = " ".join(output.split())
    for key in FIELDS.values():
        assert f"error {key}:" in flat, (key, output[-3000:])


@pytest.mark.parametrize("field", list(FIELDS))
@pytest.mark.parametrize("gadget", ALIASES)
def test_an_alias_in_a_user_module_is_refused_in_every_field(
    field: str, gadget: str, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker, run_dir = project / "pwned", project / "run"
    args = [*base_for([field]), *field_overrides(field, gadget, marker)]
    code, output = run_here([*args, f"hydra.run.dir={run_dir}"], capsys)
    assert_refused(code, output, marker, run_dir)
    flat = " ".join(output.split())
    assert f"error {FIELDS[field]}:" in flat and "is really" in flat, output[-3000:]


PRESET_FIELDS = {
    "model.target": {"model": {"target": "torch.utils.collect_env.run", "kwargs": {"command": "touch {m}"}}},
    "model.kwargs._target_": {
        "model": {
            "target": "tests.legacy_team.TinyNet",
            "spec_args": {"in_features": "num_features", "num_classes": "num_classes"},
            "kwargs": {"act": {"_target_": "tests.legacy_team.launch", "command": "touch {m}"}},
        }
    },
    "monitor.loggers": {
        "monitor": {
            "loggers": ["csv", "subprocess.Popen"],
            "logger_args": {"args": "touch {m}", "shell": True},
        }
    },
    "hydra.callbacks": {
        "hydra": {"callbacks": {"evil": {"_target_": "torch.utils.collect_env.run", "command": "touch {m}"}}}
    },
    "hydra.job_logging": {
        "hydra": {
            "job_logging": {"handlers": {"evil": {"()": "tests.legacy_team.launch", "command": "touch {m}"}}}
        }
    },
}


def write_preset(directory: Path, field: str, marker: Path) -> None:
    """A downloaded preset ``experiment=evil`` that sets *field* to a gadget."""
    (directory / "experiment").mkdir(parents=True)
    body = json.dumps(PRESET_FIELDS[field]).replace("{m}", str(marker))
    (directory / "experiment" / "evil.yaml").write_text(f"# @package _global_\n{body}\n")


@pytest.mark.parametrize("field", list(PRESET_FIELDS))
@pytest.mark.parametrize("load", ["--config-dir", "hydra.searchpath"])
def test_a_downloaded_preset_cannot_run_code(
    field: str, load: str, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker, run_dir, presets = project / "pwned", project / "run", project / "presets"
    write_preset(presets, field, marker)
    base = ["recipe=blobs", "debug=fast", "experiment=evil", f"hydra.run.dir={run_dir}"]
    if field.startswith("model"):
        base.insert(2, "model=torch_module")
    args = (
        ["--config-dir", str(presets), *base]
        if load == "--config-dir"
        else [*base, f"hydra.searchpath=[file://{presets}]"]
    )
    code, output = run_here(args, capsys)
    assert_refused(code, output, marker, run_dir)


def test_the_plan_reports_refusals_naming_the_key_and_the_fix(project: Path) -> None:
    from blocks.core import jobs

    plan = jobs.plan(["recipe=blobs", "monitor.loggers=[csv,os.system]"])
    (problem,) = [p for p in plan.errors if p.key == "monitor.loggers"]
    assert "'os.system' is refused" in problem.message and problem.fix
    with pytest.raises(ConfigError) as refused:
        jobs.plan(["recipe=blobs", "+hydra.callbacks.x._target_=torch.utils.collect_env.run"])
    assert [p.key for p in refused.value.problems] == ["hydra.callbacks.x._target_"]


def test_an_allowed_prefix_never_reaches_a_wrapper_function_or_a_denied_module() -> None:
    with pytest.raises(ConfigError, match=r"configs may never reach module torch\.utils\.collect_env"):
        resolve("torch.utils.collect_env.run", "model.kwargs.act._target_", ["torch"])
    with pytest.raises(ConfigError, match="is a function, not a class"):
        resolve("torch.nn.functional.relu", "model.kwargs.act._target_", ["torch"])
    assert resolve("torch.nn.Tanh", "model.kwargs.act._target_", ["torch"]).__name__ == "Tanh"


def test_an_imported_object_must_be_the_kind_the_field_expects(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker, run_dir = project / "pwned", project / "run"
    code, output = run_here(
        ["recipe=blobs", "debug=fast", "monitor.loggers=[csv,torch.nn.Linear]", f"hydra.run.dir={run_dir}"],
        capsys,
    )
    assert_refused(code, output, marker, run_dir)
    assert "not a Lightning logger class" in output
    code, output = run_here(
        [*ADAPTED, "model.target=tests.legacy_team.ClustersDM", f"hydra.run.dir={run_dir}"], capsys
    )
    assert_refused(code, output, marker, run_dir)
    assert "not a torch.nn.Module class" in output


def test_lightning_loggers_and_hydra_plugins_need_no_permission(project: Path) -> None:
    from blocks.core import jobs

    assert jobs.plan(["recipe=blobs", "monitor.loggers=[csv,pytorch_lightning.loggers.CSVLogger]"]).ok
    assert jobs.plan(["recipe=blobs", "hydra/launcher=joblib"]).ok
    assert jobs.plan(["recipe=blobs", "hparams_search=optuna"]).ok


def test_hydra_flags_that_skip_blocks_checks_are_refused(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for flag, value in (("--config-name", "other"), ("--experimental-rerun", str(project / "config.pickle"))):
        code, output = run_here([flag, value, "recipe=blobs"], capsys)
        assert code == 2 and flag in output and "Traceback" not in output


def blocks_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "blocks", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("case", "env"),
    [
        ("loggers", {}),
        ("popen_logger", {}),
        ("hydra_callback", {}),
        ("nested_under_allowed_torch", {"BLOCKS_ALLOW_IMPORTS": "torch,tests"}),
        ("alias", {"BLOCKS_ALLOW_IMPORTS": "tests"}),
    ],
)
def test_end_to_end_blocks_run_refuses_before_anything_starts(
    case: str, env: dict[str, str], tmp_path: Path
) -> None:
    marker, run_dir = tmp_path / "pwned", tmp_path / "run"
    args = {
        "loggers": ["monitor.loggers=[csv,os.system]", f"+monitor.logger_args.command='touch {marker}'"],
        "popen_logger": [
            "monitor.loggers=[csv,subprocess.Popen]",
            f"+monitor.logger_args.args='touch {marker}'",
            "+monitor.logger_args.shell=true",
        ],
        "hydra_callback": [
            "+hydra.callbacks.evil._target_=torch.utils.collect_env.run",
            f"+hydra.callbacks.evil.command='touch {marker}'",
        ],
        "nested_under_allowed_torch": [
            "model=torch_module",
            "model.target=tests.legacy_team.TinyNet",
            SPEC_ARGS,
            f"+model.kwargs.act={{_target_:torch.utils.collect_env.run,command:'touch {marker}'}}",
        ],
        "alias": [
            "model=torch_module",
            "model.target=tests.legacy_team.launch",
            f"+model.kwargs.command='touch {marker}'",
        ],
    }[case]
    env = {
        **env,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    result = blocks_cli(
        ["run", "recipe=blobs", "debug=fast", *args, f"hydra.run.dir={run_dir}"], tmp_path, env
    )
    assert_refused(result.returncode, result.stdout + result.stderr, marker, run_dir)


# --- Checkpoints -------------------------------------------------------------------------------


class Payload:
    """Unpickling this writes the marker file: what a crafted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


LAYOUTS = {
    "full": ["recipe=blobs", "data.samples=256"],
    "sharded": ["recipe=tiny_lm", "trainer.val_every=null", "strategy=fsdp"],
}
"""The job of each checkpoint layout (FSDP needs a model with repeated units; conftest's FSDP_LM is this one
on two processes)."""


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory, fsdp_sync_run: Path) -> dict[str, Path]:
    """A full and a sharded checkpoint that blocks wrote itself: the run dirs that hold them.

    The full one is trained here, through the CLI entry in this process; the sharded one is
    conftest's :func:`fsdp_sync_run` (two FSDP processes, checkpoints at steps 4 and 8), which
    the tests only read or copy.
    """
    root = tmp_path_factory.mktemp("honest")
    result = run_in_process(
        [
            "run",
            *LAYOUTS["full"],
            "trainer.max_steps=4",
            "checkpoint.every_n_steps=2",
            "monitor.progress=off",
            f"hydra.run.dir={root / 'full'}",
        ],
        cwd=root,
    )
    assert result.returncode == 0, result.output[-3000:]
    return {"full": root / "full", "sharded": fsdp_sync_run}


def newest(run_dir: Path) -> Path:
    from blocks.checkpoint import store

    committed, _ = store.scan(str(run_dir / "checkpoints"))
    return Path(committed[-1].url)


def crafted(honest_run: Path, target: Path, marker: Path, where: str) -> Path:
    """A copy of *honest_run* whose newest checkpoint carries a payload in *where*, recommitted."""
    import torch

    from blocks.checkpoint import store

    shutil.copytree(honest_run, target)
    url = newest(target)
    if where == "state":
        state = torch.load(url / "state.pt", weights_only=True)
        state["payload"] = Payload(marker)
        torch.save(state, url / "state.pt")
    elif where == "metadata":
        with open(url / "dcp" / ".metadata", "rb") as fh:
            metadata = pickle.load(fh)  # our own honest file
        metadata.planner_data["payload"] = Payload(marker)
        with open(url / "dcp" / ".metadata", "wb") as fh:
            pickle.dump(metadata, fh)
    else:
        assert where == "shard_entry"
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        shards: dict = {}
        _load_state_dict(
            shards,
            storage_reader=FileSystemReader(str(url / "dcp")),
            planner=_EmptyStateDictLoadPlanner(),
            no_dist=True,
        )
        shards["optimizer_0"]["param_groups"][0]["lr"] = Payload(marker)
        shutil.rmtree(url / "dcp")
        dcp.save(shards, storage_writer=FileSystemWriter(str(url / "dcp")), no_dist=True)
    store.commit(str(url), store.read_manifest(str(url)))
    assert not marker.exists()
    return url


CASES = [("full", "state"), ("sharded", "metadata"), ("sharded", "shard_entry"), ("sharded", "state")]


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")  # with the FSDP checkpoint tests, which share fsdp_sync_run
@pytest.mark.parametrize(("layout", "where"), CASES)
def test_a_crafted_checkpoint_is_refused_everywhere(
    layout: str, where: str, honest: dict[str, Path], tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    run = tmp_path / "evil_run"
    url = crafted(honest[layout], run, marker, where)
    job = LAYOUTS[layout]
    single = [a for a in job if a != "strategy=fsdp"]
    init = run_in_process(
        ["run", *single, "debug=fast", f"model.init_from={url}", f"hydra.run.dir={tmp_path / 'init'}"],
        cwd=tmp_path,
    )
    # Weights come from the shards alone: a sharded checkpoint's state.pt is read only to resume.
    weights_refused = not (layout == "sharded" and where == "state")
    if weights_refused:
        assert init.returncode != 0 and "refusing to load" in init.output, init.output[-3000:]
    assert "Traceback" not in init.output
    assert not marker.exists()
    resumes = [
        [
            "run",
            *job,
            *([f"data.batch_size={16 // devices}"] if layout == "sharded" else []),
            "trainer.max_steps=12",
            f"trainer.devices={devices}",
            f"checkpoint.resume={url}",
            f"hydra.run.dir={tmp_path / f'resume{devices}'}",
        ]
        for devices in ([1, 2] if layout == "sharded" else [1])
    ]
    # A resume is refused by the driver before any worker starts; eval and export load it themselves.
    for command in [*resumes, ["eval", str(url)], ["export", str(url), str(tmp_path / "export")]]:
        result = run_in_process(command, cwd=tmp_path)  # the console script's entry, in this process
        if weights_refused or command[0] == "run":
            assert result.returncode == 2 and "refusing to load" in result.output, result.output[-3000:]
        assert "Traceback" not in result.output
    assert not list(tmp_path.glob("resume*/summary.json")), "a refused resume trained nothing"
    # Rollback loads the newest committed checkpoint with the strategy's loader: the same ones.
    from blocks.checkpoint.export import checkpoint_weights
    from blocks.checkpoint.io import FsspecCheckpointIO, UnsafeCheckpointError, load_state

    with pytest.raises(UnsafeCheckpointError):
        if layout == "full":
            FsspecCheckpointIO().load_checkpoint(str(url))
        elif where == "state":
            load_state(str(url))  # what ShardedCheckpointStrategy.load_checkpoint returns
        else:
            checkpoint_weights(str(url))
    assert not marker.exists(), "a crafted checkpoint ran code"


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")  # with the FSDP checkpoint tests, which share fsdp_sync_run
def test_honest_checkpoints_still_load(honest: dict[str, Path], fsdp_resumed_on_two: dict[str, Path]) -> None:
    from blocks.checkpoint import store
    from blocks.checkpoint.export import checkpoint_weights
    from blocks.checkpoint.io import FsspecCheckpointIO

    assert "state_dict" in FsspecCheckpointIO().load_checkpoint(str(newest(honest["full"])))
    assert checkpoint_weights(str(newest(honest["sharded"])))
    # conftest's fsdp_resumed_on_two: a `blocks run` on two processes that resumed a copy of
    # the honest sharded checkpoint (step 8) and trained on to step 12.
    resumed = read_summary(fsdp_resumed_on_two["run"])
    assert resumed["status"] == "completed" and resumed["world_size"] == 2
    assert resumed["resumed_from"].endswith(store.step_dir_name(8))


def test_the_metadata_path_compat_function_matches_torch(tmp_path: Path) -> None:
    from blocks.checkpoint.safe_dcp import SafeFsspecReader
    from blocks.compat.dcp_private import dcp_metadata_path as metadata_path

    reader = SafeFsspecReader(str(tmp_path))
    assert str(metadata_path(reader, None)).endswith("/.metadata")
    assert str(metadata_path(reader, 1)).endswith("/__1.metadata")


def test_the_metadata_unpickler_refuses_anything_but_metadata(tmp_path: Path) -> None:
    import io

    from blocks.checkpoint.io import UnsafeCheckpointError
    from blocks.checkpoint.safe_dcp import load_metadata

    marker = tmp_path / "pwned"
    with pytest.raises(UnsafeCheckpointError, match=r"posix\.system is not part of a checkpoint's metadata"):
        load_metadata(io.BytesIO(pickle.dumps(Payload(marker))), "crafted")
    with pytest.raises(UnsafeCheckpointError, match="not DCP metadata"):
        load_metadata(io.BytesIO(pickle.dumps({"a": 1})), "crafted")
    assert not marker.exists()


# --- Secrets -----------------------------------------------------------------------------------


def test_environment_values_stay_out_of_the_run_dir_and_workers_still_read_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blocks.launch.driver import prepare
    from blocks.launch.run_dir import load_plan

    secret = "s3cr3t-token-value"
    monkeypatch.setenv("BLOCKS_TEST_SECRET", secret)
    run_dir = tmp_path / "run"
    prepare(
        ["recipe=blobs", "debug=fast", "+monitor.logger_args.name=${oc.env:BLOCKS_TEST_SECRET}"],
        run_dir,
    )
    for name in ("config.yaml", "plan.json"):
        text = (run_dir / name).read_text()
        assert secret not in text and "${oc.env:BLOCKS_TEST_SECRET}" in text, name
    assert load_plan(run_dir).monitor.logger_args["name"] == secret


@pytest.mark.parametrize("spelling", ["${ oc.env:BLOCKS_TEST_SECRET}", "${oc.env :BLOCKS_TEST_SECRET,none}"])
def test_every_spelling_of_an_environment_read_stays_out_of_the_run_dir(
    spelling: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OmegaConf reads the environment however the interpolation is spaced; so does the secret search."""
    from blocks.launch.driver import prepare
    from blocks.launch.run_dir import load_plan

    secret = "s3cr3t-spaced-out"
    monkeypatch.setenv("BLOCKS_TEST_SECRET", secret)
    run_dir = tmp_path / "run"
    prepare(["recipe=blobs", "debug=fast", f"+monitor.logger_args.name='{spelling}'"], run_dir)
    for name in ("config.yaml", "plan.json"):
        assert secret not in (run_dir / name).read_text(), name
    assert load_plan(run_dir).monitor.logger_args["name"] == secret


def test_values_passed_on_from_the_environment_by_other_keys_stay_out_of_the_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key that interpolates a key read from the environment holds the secret too: it stays an interpolation."""
    from blocks.launch.driver import prepare
    from blocks.launch.run_dir import load_plan

    secret = "s3cr3t-passed-on"
    monkeypatch.setenv("BLOCKS_TEST_SECRET", secret)
    run_dir = tmp_path / "run"
    prepare(
        [
            "recipe=blobs",
            "debug=fast",
            "+monitor.logger_args.name=${oc.env:BLOCKS_TEST_SECRET}",
            "+monitor.logger_args.copy=${monitor.logger_args.name}",
            "+monitor.logger_args.header='Bearer ${monitor.logger_args.copy}'",
            "+monitor.logger_args.nested={inner: '${oc.env:BLOCKS_TEST_SECRET}', plain: 1}",
            "+monitor.logger_args.tree=${monitor.logger_args.nested}",
            "+monitor.logger_args.unrelated=${trainer.seed}",
        ],
        run_dir,
    )
    for name in ("config.yaml", "plan.json"):
        text = (run_dir / name).read_text()
        assert secret not in text, name
        assert "${monitor.logger_args.copy}" in text and "${monitor.logger_args.nested}" in text, name
    args = load_plan(run_dir).monitor.logger_args
    assert (args["copy"], args["header"]) == (secret, f"Bearer {secret}")
    assert args["tree"] == {"inner": secret, "plain": 1}
    assert "${trainer.seed}" not in (run_dir / "config.yaml").read_text(), "other interpolations are frozen"


def test_a_worker_rebuilds_the_drivers_blocks_from_values_passed_on_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values passed on stay interpolations, resolved by each worker to what the driver had.

    A typed field's environment value passed on to an untyped one is the field's type (the
    seed 7, not the string "7"), and a secret decoded by ``oc.decode`` stays out of the files.
    """
    from blocks.launch.driver import prepare
    from blocks.launch.run_dir import load_plan

    monkeypatch.setenv("BLOCKS_TEST_SEED", "7")
    monkeypatch.setenv("BLOCKS_TEST_SECRET", "s3cr3t-decoded")
    monkeypatch.setenv("BLOCKS_TEST_SECRETS", "{token: s3cr3t-in-a-dict}")
    run_dir = tmp_path / "run"
    plan = prepare(
        [
            "recipe=blobs",
            "debug=fast",
            "trainer.seed=${oc.env:BLOCKS_TEST_SEED}",
            "+monitor.logger_args.version=${trainer.seed}",
            "+monitor.logger_args.token=${oc.env:BLOCKS_TEST_SECRET}",
            "+monitor.logger_args.decoded='${oc.decode:${monitor.logger_args.token}}'",
            "+monitor.logger_args.secrets=${oc.env:BLOCKS_TEST_SECRETS}",
            "+monitor.logger_args.decoded_dict='${oc.decode:${monitor.logger_args.secrets}}'",
        ],
        run_dir,
    )
    assert plan.monitor.logger_args["version"] == 7
    assert plan.monitor.logger_args["decoded_dict"] == {"token": "s3cr3t-in-a-dict"}
    assert load_plan(run_dir).blocks == plan.blocks
    for name in ("config.yaml", "plan.json"):
        assert "s3cr3t" not in (run_dir / name).read_text(), name


@pytest.mark.parametrize("passed_on", [False, True])
def test_the_python_api_refuses_an_import_path_read_from_the_environment(
    passed_on: bool, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``driver.prepare``/``run`` refuse what ``blocks run`` refuses: a path checked here, imported from another environment."""
    from blocks.launch.driver import prepare

    monkeypatch.setenv("BLOCKS_TEST_MODEL", "tests.legacy_team.TinyNet")
    env = "${oc.env:BLOCKS_TEST_MODEL}"
    given = [f"+monitor.logger_args.model={env}", "model.target=${monitor.logger_args.model}"]
    run_dir = project / "run"
    with pytest.raises(ConfigError) as refused:
        prepare([*base_for(["model.target"]), *(given if passed_on else [f"model.target={env}"])], run_dir)
    assert [(p.key, p.check) for p in refused.value.problems] == [("model.target", "import-path")]
    assert not run_dir.exists()


def unwrapped(output: str) -> str:
    """*output* without whitespace and panel borders: a rich panel folds long text over lines."""
    return re.sub(r"[\s│]", "", output)


def hidden_everywhere(secret: str, output: str, run_dir: Path) -> None:
    """*secret* is in neither the command's output nor any text file of *run_dir*."""
    assert secret not in unwrapped(output), output[-3000:]
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".yaml", ".json", ".csv", ".log", ".txt"):
            assert secret not in path.read_text(errors="replace"), path


@pytest.mark.parametrize("flags", [[], ["--json"], ["-m"], ["-m", "--json"]])
def test_blocks_plan_shows_environment_values_as_their_interpolation(
    flags: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan printed on a terminal (a CI or SLURM log) holds no value read from the environment."""
    secret = "s3cr3t-on-the-terminal"
    monkeypatch.setenv("BLOCKS_TEST_SECRET", secret)
    result = run_in_process(
        [
            "plan",
            *flags,
            "recipe=blobs",
            "+monitor.logger_args.name=${oc.env:BLOCKS_TEST_SECRET}",
            "+monitor.logger_args.header='Bearer ${monitor.logger_args.name}'",
            "trainer.seed=1,2" if "-m" in flags else "trainer.seed=1",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.output[-3000:]
    shown = unwrapped(result.output)
    assert secret not in shown
    assert "${oc.env:BLOCKS_TEST_SECRET}" in shown and "${monitor.logger_args.name}" in shown
    if "--json" in flags:  # the output holds stderr too: a warning may come first
        start = re.search(r"^[\[{]", result.output, re.MULTILINE)
        assert start is not None, result.output[-3000:]
        plans = json.loads(result.output[start.start() :])
        for plan in plans if isinstance(plans, list) else [plans]:
            shown = plan["blocks"]["monitor"]["fields"]["logger_args"]
            assert shown == {
                "name": "${oc.env:BLOCKS_TEST_SECRET}",
                "header": "Bearer ${monitor.logger_args.name}",
            }


@pytest.mark.slow
def test_a_run_reads_environment_values_that_its_files_do_not_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cr3t-run-name"
    monkeypatch.setenv("BLOCKS_TEST_SECRET", secret)
    run_dir = tmp_path / "run"
    result = run_in_process(
        [
            "run",
            "recipe=blobs",
            "debug=fast",
            "monitor.loggers=[csv,pytorch_lightning.loggers.CSVLogger]",
            f"+monitor.logger_args.save_dir={tmp_path / 'logs'}",
            "+monitor.logger_args.name=${oc.env:BLOCKS_TEST_SECRET}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.output[-3000:]
    assert (tmp_path / "logs" / secret).is_dir(), "the logger got the value from the environment"
    hidden_everywhere(secret, result.output, run_dir)  # the plan printed before the run hides it too


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_a_plan_problem_quoting_an_environment_value_hides_it(
    flags: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A problem's message may quote a field (a path that holds no checkpoint): the value stays hidden."""
    secret = "s3cr3t-in-a-message"
    monkeypatch.setenv("BLOCKS_TEST_SECRET", secret)
    result = run_in_process(
        ["plan", *flags, "recipe=blobs", "checkpoint.resume=/nonexistent/${oc.env:BLOCKS_TEST_SECRET}"],
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.output[-3000:]
    shown = unwrapped(result.output)
    assert secret not in shown
    assert "/nonexistent/${oc.env:BLOCKS_TEST_SECRET}isnotacommittedcheckpoint" in shown


@pytest.mark.slow
def test_a_failing_run_hides_environment_values_in_its_output_log_and_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warning (blocks.log) and the error that ends the run (summary.json) quote paths read from the environment."""
    secret = "s3cr3t-in-a-path"
    monkeypatch.setenv("BLOCKS_TEST_SECRET", secret)
    run_dir = tmp_path / "run"
    result = run_in_process(
        [
            "run",
            "recipe=blobs",
            "debug=fast",
            "checkpoint.dir=memory://ck-${oc.env:BLOCKS_TEST_SECRET}",
            f"model.init_from={tmp_path}/nothing-${{oc.env:BLOCKS_TEST_SECRET}}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.output[-3000:]
    hidden_everywhere(secret, result.output, run_dir)
    assert (
        "memory://ck-${oc.env:BLOCKS_TEST_SECRET} keeps checkpoints in memory"
        in (run_dir / "blocks.log").read_text()
    )
    assert "nothing-${oc.env:BLOCKS_TEST_SECRET}: nothing exists there" in read_summary(run_dir)["reason"]


CRASHING_CALLBACK = (
    "{_target_: pytorch_lightning.callbacks.StochasticWeightAveraging, swa_lrs: 0.01, swa_epoch_start: 1, "
    "device: 'cpu-${oc.env:BLOCKS_TEST_SECRET}'}"
)
"""A Lightning callback that raises once training starts, quoting its device: a secret read from the environment."""


@pytest.mark.slow
def test_torchrun_workers_and_torchrun_hide_secrets_in_what_they_print(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's uncaught error reaches the worker's output, torchrun's failure account and the summary."""
    secret = "s3cr3t-in-a-worker"
    monkeypatch.setenv("BLOCKS_TEST_SECRET", secret)
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            "run",
            "recipe=blobs",
            "debug=fast",
            "strategy=ddp",
            "trainer.devices=2",
            f"trainer.callbacks=[{CRASHING_CALLBACK}]",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode != 0, result.output[-3000:]
    assert "Invalid device string: 'cpu-${oc.env:BLOCKS_TEST_SECRET}'" in result.output, result.output[-3000:]
    hidden_everywhere(secret, result.output, run_dir)


def test_a_joblib_sweep_hears_of_its_jobs_in_other_processes_and_their_crashes_hide_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs under hydra/launcher=joblib end in processes of their own: each reports how it ended to
    the sweep (through a directory of the sweep's own, removed at the end). A failed summary an
    earlier sweep left in the sweep dir was blamed on this one.

    One sweep of four jobs: a diverging one, a completed one, and two whose callback crashes in
    the job's joblib process with a traceback quoting a secret, which it hides."""
    secret = "s3cr3t-in-a-sweep-job"
    monkeypatch.setenv("BLOCKS_TEST_SECRET", secret)
    sweep = tmp_path / "sweep"
    (sweep / "5").mkdir(parents=True)
    (sweep / "5" / "summary.json").write_text(
        json.dumps({"status": "failed", "reason": "an earlier sweep's"})
    )
    result = run_cli(
        [
            "run",
            "-m",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",  # 1 would run them in this process
            "recipe=blobs",
            "trainer.max_steps=3",
            f"trainer.callbacks=[],[{CRASHING_CALLBACK}]",  # jobs 0 and 1 without, 2 and 3 with
            "optim.lr=1e30,1e-3",
            "monitor.progress=off",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.output[-3000:]
    did_not_complete = ", ".join(str(sweep / job) for job in ("0", "2", "3"))
    assert f"3 job(s) of the sweep did not complete: {did_not_complete} (their" in result.output
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "1", "2", "3", "5", "multirun.yaml"]
    assert read_summary(sweep / "1")["status"] == "completed"
    assert "the job crashed" in result.output, result.output[-3000:]
    assert "Invalid device string: 'cpu-${oc.env:BLOCKS_TEST_SECRET}'" in result.output, result.output[-3000:]
    hidden_everywhere(secret, result.output, sweep)


def test_secrets_in_overrides_are_hidden_in_composition_errors_and_only_whole_secrets_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A composition error quotes the value an override read; a secret that is a word of other text is left alone."""
    monkeypatch.setenv("BLOCKS_TEST_SECRET", "not-a-number-s3cr3t")
    failed = run_in_process(
        ["plan", "recipe=blobs", "trainer.max_steps=${oc.env:BLOCKS_TEST_SECRET}"], cwd=tmp_path
    )
    assert failed.returncode == 2 and "trainer.max_steps" in failed.output, failed.output[-3000:]
    assert "not-a-number-s3cr3t" not in unwrapped(failed.output)
    monkeypatch.setenv("BLOCKS_TEST_TOKEN", "false")  # shorter than a secret worth hiding
    monkeypatch.setenv("BLOCKS_TEST_PASSWORD", "2024-13-45")  # YAML reads it as an impossible date
    args = [
        "+monitor.logger_args.a=${oc.env:BLOCKS_TEST_TOKEN}",
        "+monitor.logger_args.b=${oc.env:BLOCKS_TEST_PASSWORD}",
    ]
    plan = run_in_process(["plan", "--json", "recipe=blobs", *args], cwd=tmp_path)
    assert plan.returncode == 0, plan.output[-3000:]
    assert json.loads(plan.output[plan.output.index("{") :])["valid"] is True


def test_log_records_hide_environment_values_and_logging_still_reports_bad_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import logging

    from omegaconf import OmegaConf

    from blocks.core.masking import hide_environment_values

    monkeypatch.setenv("BLOCKS_TEST_SECRET", "s3cr3t-logged")
    hide_environment_values(OmegaConf.create({"token": "${oc.env:BLOCKS_TEST_SECRET}"}))
    make = logging.getLogRecordFactory()
    record = make("blocks", logging.WARNING, __file__, 1, "token %s", ("s3cr3t-logged",), None)
    assert record.getMessage() == "token ${oc.env:BLOCKS_TEST_SECRET}"
    record = make("blocks", logging.WARNING, __file__, 1, "%s and %s", ("one",), None)  # one argument short
    with pytest.raises(TypeError):
        record.getMessage()  # left for the handler to report, as logging does


def test_the_password_of_a_url_read_from_the_environment_is_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """A URL's password is hidden whatever the variable is called; the rest of the URL is shown."""
    from omegaconf import OmegaConf

    from blocks.core.masking import hidden, hide_environment_values

    monkeypatch.setenv("BLOCKS_TEST_TRACKING_URI", "http://bob:pa55-in-a-url@tracking.example:5000")
    hide_environment_values(OmegaConf.create({"monitor": {"uri": "${oc.env:BLOCKS_TEST_TRACKING_URI}"}}))
    shown = hidden("cannot reach http://bob:pa55-in-a-url@tracking.example:5000/api")
    assert shown == "cannot reach http://bob:${oc.env:BLOCKS_TEST_TRACKING_URI}@tracking.example:5000/api"


def test_an_uncaught_traceback_hides_secrets(tmp_path: Path) -> None:
    """What the interpreter prints for an exception that ends the process (``HYDRA_FULL_ERROR=1``, a worker)."""
    script = (
        "from omegaconf import OmegaConf\n"
        "from blocks.core.masking import hide_environment_values\n"
        "hide_environment_values(OmegaConf.create({'key': '${oc.env:BLOCKS_TEST_TOKEN}'}))\n"
        "raise RuntimeError('cannot reach https://user:s3cr3t-uncaught@example.invalid')\n"
    )
    env = {**os.environ, "BLOCKS_TEST_TOKEN": "s3cr3t-uncaught"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert (
        result.returncode == 1
        and "RuntimeError: cannot reach https://user:${oc.env:BLOCKS_TEST_TOKEN}@" in result.stderr
    )
    assert "s3cr3t-uncaught" not in result.stderr


def test_which_names_and_which_parts_of_values_are_secrets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import threading

    from omegaconf import OmegaConf

    from blocks.core.masking import hidden, hide_environment_values, names_a_secret

    secrets = ["HF_TOKEN", "WANDB_API_KEY", "PGPASSWORD", "DB_PASS", "GITHUB_PAT", "clientSecret", "HFToken"]
    assert all(names_a_secret(name) for name in secrets)
    others = ["tokenizer", "monkey", "PWD", "passthrough", "BATCH_SIZE", "image_keys", "sig_figs"]
    assert not any(names_a_secret(name) for name in others)
    credentials = {"type": "service_account", "private_key": "s3cr3t-pem-body", "client_email": "bot@ex.iam"}
    monkeypatch.setenv("BLOCKS_TEST_CREDENTIALS", json.dumps(credentials))
    shared_url = "https://acct.blob.example/c?sv=2024-11-04&sig=s3cr3t%2Bsignature%3D"  # percent-encoded
    monkeypatch.setenv("BLOCKS_TEST_SHARED_URL", shared_url)
    monkeypatch.setenv("BLOCKS_TEST_SECRET", 'pa"ss\\word-s3cr3t')
    monkeypatch.setenv(
        "BLOCKS_TEST_PASSWORDS", "{prod: s3cr3t-prod-pw, staging: s3cr3t-staging-pw, loop: &a [*a]}"
    )
    monkeypatch.setenv("BLOCKS_TEST_DATABASE", "postgresql://readonly_analytics_user@db.example/runs")
    names = ("credentials", "shared_url", "secret", "passwords", "database")
    hide_environment_values(
        OmegaConf.create({name: f"${{oc.env:BLOCKS_TEST_{name.upper()}}}" for name in names})
    )
    assert hidden("service_account s3cr3t-pem-body") == "service_account ${oc.env:BLOCKS_TEST_CREDENTIALS}"
    shown = hidden(f"GET {shared_url}")
    assert shown == "GET https://acct.blob.example/c?sv=2024-11-04&sig=${oc.env:BLOCKS_TEST_SHARED_URL}"
    shown = hidden("s3cr3t-prod-pw, s3cr3t-staging-pw")
    assert shown == "${oc.env:BLOCKS_TEST_PASSWORDS}, ${oc.env:BLOCKS_TEST_PASSWORDS}"
    assert hidden("connected as readonly_analytics_user") == "connected as readonly_analytics_user"
    message = json.dumps({"message": 'cannot log in with pa"ss\\word-s3cr3t'})  # escaped in JSON
    assert json.loads(hidden(message)) == {"message": "cannot log in with ${oc.env:BLOCKS_TEST_SECRET}"}

    def fail() -> None:
        raise RuntimeError("s3cr3t-pem-body rejected")

    thread = threading.Thread(target=fail)
    thread.start()
    thread.join()
    printed = capsys.readouterr().err
    assert (
        "RuntimeError: ${oc.env:BLOCKS_TEST_CREDENTIALS} rejected" in printed and "s3cr3t-pem" not in printed
    )


@pytest.mark.slow
def test_environment_values_that_name_no_secret_are_shown_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only secrets are hidden: a word or a number read from the environment may be in any text, file or key."""
    monkeypatch.setenv("BLOCKS_TEST_WORD", "completed")
    monkeypatch.setenv("BLOCKS_TEST_BATCH", "16")
    args = ["recipe=blobs", "debug=fast", "+monitor.logger_args.note=${oc.env:BLOCKS_TEST_WORD}"]
    args.append("data.batch_size=${oc.env:BLOCKS_TEST_BATCH}")
    plan = run_in_process(["plan", "--json", *args], cwd=tmp_path)
    assert plan.returncode == 0, plan.output[-3000:]
    assert json.loads(plan.output[plan.output.index("{") :])["derived"]["micro_batch"] == 16
    run_dir = tmp_path / "run"
    result = run_in_process(["run", *args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    assert read_summary(run_dir)["status"] == "completed"
    assert unwrapped(result.output).count("${oc.env:BLOCKS_TEST_WORD}") == 1, (
        "the plan's setting, and no other text"
    )


def test_loggers_get_env_secrets_as_interpolations_not_values(tmp_path: Path, monkeypatch) -> None:
    """Every logger receives the config as hyperparameters; a ``${oc.env:...}`` secret must not reach its server."""
    from blocks.core import jobs
    from blocks.runtime.trainer import run_hyperparameters

    monkeypatch.setenv("BLOCKS_TEST_SECRET", "s3cr3t-value")
    (tmp_path / "config.yaml").write_text(
        "monitor:\n  logger_args:\n    token: ${oc.env:BLOCKS_TEST_SECRET}\n"
    )
    logged = run_hyperparameters(jobs.plan(["recipe=blobs"]), tmp_path)
    assert "s3cr3t-value" not in repr(logged)
    assert any("oc.env:BLOCKS_TEST_SECRET" in str(value) for value in logged.values())


@pytest.mark.parametrize("passed_on", [False, True])
def test_a_sweep_over_values_read_from_the_environment_writes_none_of_them(
    passed_on: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A swept key whose values read the environment identifies each job by its interpolation text.

    ``.sweep-job.json`` recorded each job's swept values resolved: the secret, in a file of the
    run dir, while ``config.yaml`` and ``plan.json`` kept ``${oc.env:...}``. With another override
    that passes the value on (an interpolation of a config key), the sweep's callback read the
    overrides resolved, failed, and followed none of the jobs.
    """
    secrets = ("s3cr3t-swept-a", "s3cr3t-swept-b")
    monkeypatch.setenv("BLOCKS_TEST_SECRET", secrets[0])
    monkeypatch.setenv("BLOCKS_TEST_SECRET_B", secrets[1])
    sweep = tmp_path / "sweep"
    result = run_in_process(
        [
            "run",
            "-m",
            "recipe=blobs",
            "trainer.max_steps=2",
            "monitor.progress=off",
            "+monitor.logger_args.csv.name='${oc.env:BLOCKS_TEST_SECRET}','${oc.env:BLOCKS_TEST_SECRET_B}'",
            *(["+monitor.logger_args.csv.version='v-${monitor.logger_args.csv.name}'"] if passed_on else []),
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.output[-3000:]
    identity = json.loads((sweep / "1" / ".sweep-job.json").read_text())["identity"]
    assert identity == {"monitor.logger_args.csv.name": "${oc.env:BLOCKS_TEST_SECRET_B}"}
    for secret in secrets:
        hidden_everywhere(secret, result.output, sweep)


def test_a_swept_value_read_from_the_environment_is_named_without_reading_it() -> None:
    """The swept value's interpolation text was looked up only after resolving it, which read the
    environment (and failed on a variable not set where the sweep records its jobs)."""
    from omegaconf import OmegaConf

    from blocks.launch.sweep import job_value

    config = OmegaConf.create({"monitor": {"tag": "${oc.env:BLOCKS_TEST_NEVER_SET}"}})
    assert job_value(config, {}, "monitor.tag") == "${oc.env:BLOCKS_TEST_NEVER_SET}"
