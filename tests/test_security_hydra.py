"""What a config can make Hydra itself do, around the import seam: each way is refused before anything runs.

The payload is ``tests.legacy_team.Touch``, a class whose constructor creates a file: a config
that reached it made code run. No prefix is allowed here (``BLOCKS_ALLOW_IMPORTS`` unset), so
blocks' own checks refuse it wherever they see it; each case hides it, or opens the
allow-list, in a way those checks did not see before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from blocks.core import jobs
from blocks.spec.errors import ConfigError
from tests.test_security import assert_refused, run_here

PAYLOAD = "tests.legacy_team.Touch"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with no allowed import prefix."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BLOCKS_ALLOW_IMPORTS", raising=False)
    return tmp_path


def refused_keys(overrides: list[str]) -> list[str]:
    """The keys ``blocks plan`` names for *overrides* (it must refuse them)."""
    with pytest.raises(ConfigError) as refused:
        jobs.plan(["recipe=blobs", *overrides])
    return [problem.key for problem in refused.value.problems]


def test_a_callback_built_by_an_interpolation_is_checked_as_what_it_builds(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``oc.decode`` turns a string into a node when Hydra resolves it: the check saw only a string."""
    marker, run_dir = here / "pwned", here / "run"
    built = f'${{oc.decode:"{{_target_: {PAYLOAD}, path: {marker}}}"}}'
    code, output = run_here(
        ["recipe=blobs", "debug=fast", f"+hydra.callbacks.evil='{built}'", f"hydra.run.dir={run_dir}"], capsys
    )
    assert_refused(code, output, marker, run_dir)
    assert "error hydra.callbacks.evil._target_" in output and PAYLOAD in output


def preset(root: Path, name: str, text: str) -> Path:
    """A ``--config-dir`` at *root* with ``experiment/NAME.yaml`` (a preset shared by another team)."""
    (root / "experiment").mkdir(parents=True, exist_ok=True)
    (root / "experiment" / f"{name}.yaml").write_text("# @package _global_\n" + text)
    return root


def test_a_node_interpolated_into_the_hydra_node_is_checked_as_what_it_becomes(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only ``oc.decode``/``oc.create`` values were resolved: ``hydra.callbacks.x: ${stash}``, with
    ``stash`` a node of the preset holding a ``_target_`` (or a logging ``()`` factory), reached
    Hydra unchecked, and a shared preset ran code in a plain ``blocks run``."""
    marker, run_dir = here / "pwned", here / "run"
    stash = f"stash:\n  _target_: {PAYLOAD}\n  path: {marker}\n"
    presets = preset(here / "presets", "callback", stash + "hydra:\n  callbacks:\n    x: ${stash}\n")
    code, output = run_here(
        [
            "--config-dir",
            str(presets),
            "recipe=blobs",
            "debug=fast",
            "experiment=callback",
            f"hydra.run.dir={run_dir}",
        ],
        capsys,
    )
    assert_refused(code, output, marker, run_dir)
    assert "error hydra.callbacks.x._target_" in output and PAYLOAD in output

    factory = f"stash:\n  '()': {PAYLOAD}\n  path: {marker}\n"
    preset(presets, "filter", factory + "hydra:\n  job_logging:\n    filters:\n      f: ${stash}\n")
    nested = f"inner:\n  _target_: {PAYLOAD}\n  path: {marker}\nstash:\n  a: ${{inner}}\n"
    preset(presets, "nested", nested + "hydra:\n  callbacks:\n    x: ${oc.select:stash}\n")
    preset(presets, "cycle", "stash:\n  a: ${stash}\nhydra:\n  callbacks:\n    x: ${stash}\n")
    expected = {
        "filter": "hydra.job_logging.filters.f.()",
        "nested": "hydra.callbacks.x.a._target_",
        "cycle": "hydra.callbacks.x.a",
    }
    for name, key in expected.items():
        with pytest.raises(ConfigError) as refused:
            jobs.plan(["recipe=blobs", f"experiment={name}"], config_dir=str(presets))
        assert [problem.key for problem in refused.value.problems] == [key], name
    assert not marker.exists()


def test_a_preset_that_is_not_yaml_is_a_config_error_naming_the_file(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A syntax error in a preset file ended ``blocks plan`` and ``blocks run`` with PyYAML's traceback."""
    presets = preset(here / "presets", "broken", "hydra:\n  job_logging:\n    filters: {f: ${stash}}\n")
    with pytest.raises(ConfigError) as refused:
        jobs.plan(["recipe=blobs", "experiment=broken"], config_dir=str(presets))
    problem = refused.value.problems[0]
    assert problem.key == "experiment" and problem.check == "yaml-syntax"
    assert "broken.yaml, line 4" in problem.message and "quote" in problem.fix
    code, output = run_here(["--config-dir", str(presets), "recipe=blobs", "experiment=broken"], capsys)
    assert code == 2 and "Traceback" not in output and "is not valid YAML" in output


def test_hydra_logging_writes_only_to_the_run_dir_and_the_sweeper_imports_no_function(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only ``class``, ``()`` and ``ext://`` were checked: a preset pointed the job log's file handler
    at any file (``mode: w`` truncated it; a format put a shell line before every record, in a
    ``~/.bashrc``), and ``hydra.sweeper.custom_search_space`` made the Optuna sweeper import a
    module and call a function with every trial."""
    victim, run_dir = here / "bashrc", here / "run"
    victim.write_text("original\n")
    handler = (
        f"hydra:\n  job_logging:\n    handlers:\n      file:\n        filename: {victim}\n        mode: w\n"
    )
    presets = preset(here / "presets", "log", handler)
    code, output = run_here(
        [
            "--config-dir",
            str(presets),
            "recipe=blobs",
            "debug=fast",
            "experiment=log",
            f"hydra.run.dir={run_dir}",
        ],
        capsys,
    )
    assert code == 2 and "Traceback" not in output and not run_dir.exists(), output[-3000:]
    assert victim.read_text() == "original\n" and "hydra.job_logging.handlers.file.filename" in output
    assert refused_keys(["hydra.job_logging.handlers.file.filename=../outside.log"]) == [
        "hydra.job_logging.handlers.file.filename"
    ]
    assert refused_keys(["hydra.job.name=../../outside"]) == ["hydra.job.name"]
    assert refused_keys(["hydra.job.name=${hydra.job.num}/../outside"]) == ["hydra.job.name"]
    remote = "{class: logging.handlers.SocketHandler, host: 127.0.0.1, port: 9}"
    assert refused_keys([f"+hydra.job_logging.handlers.net={remote}"]) == [
        "hydra.job_logging.handlers.net.class"
    ]
    with pytest.raises(ConfigError) as refused:
        jobs.plan(["recipe=blobs", "hparams_search=optuna", "hydra.sweeper.custom_search_space=os.system"])
    assert [p.key for p in refused.value.problems] == ["hydra.sweeper.custom_search_space"]
    attributes = (
        '{class:logging.FileHandler,filename:"${hydra.runtime.output_dir}/ok.log",.:{baseFilename:/x}}'
    )
    assert refused_keys([f"+hydra.job_logging.handlers.g={attributes}"]) == ["hydra.job_logging.handlers.g.."]
    assert refused_keys(["hydra.runtime.output_dir=/elsewhere"]) == ["hydra.runtime.output_dir"]
    assert refused_keys(["hydra.output_subdir=/elsewhere"]) == ["hydra.output_subdir"]
    # an ext:// that an interpolation builds (logging imports it after Hydra resolved the text)
    stream = "hydra.job_logging.handlers.console.stream"
    assert refused_keys(["+hydra.job_logging.p=ext", f"{stream}=${{hydra.job_logging.p}}://this.s"]) == [
        stream
    ]
    assert refused_keys([f"{stream}=${{oc.decode:'ext://this.s'}}"]) == [stream]
    # a bare name is where blocks starts: only hydra_logging's own (configured before the run dir exists)
    job_file, hydra_file = (
        "hydra.job_logging.handlers.file.filename",
        "hydra.hydra_logging.handlers.file.filename",
    )
    assert refused_keys([f"{job_file}=victim.log"]) == [job_file]
    debug = "hydra/hydra_logging=hydra_debug"
    assert refused_keys([debug, f"{hydra_file}=${{hydra.runtime.output_dir}}/h.log"]) == [hydra_file]
    fine = [
        ["hydra.job.name=train-1"],
        ["hydra.job_logging.handlers.file.filename=${hydra.runtime.output_dir}/x.log"],
        ["hydra.job_logging.handlers.file.filename=${hydra:runtime.output_dir}/x.log"],
        ["hydra/hydra_logging=hydra_debug"],  # Hydra's own: hydra-${hydra.job.name}.log where blocks starts
        ["hydra.job_logging.root.level=${hydra:hydra_logging.root.level}"],  # resolved as Hydra will
        ["hparams_search=optuna", "hydra.sweeper.study_name=${hydra:job.name}"],
        ["hydra.output_subdir=null"],
        ["hydra.job.name=job_${hydra.job.num}"],  # Hydra's launcher sets the number after the check
        ["hydra.output_subdir=.hydra_${hydra.job.num}"],
        ["hydra.job.name=${hydra.runtime.choices.optim}_${hydra.job.num}"],  # the rest resolves as Hydra will
    ]
    for overrides in fine:
        assert jobs.plan(["recipe=blobs", *overrides]).ok, overrides


def test_a_sweep_with_another_sweeper_checks_every_override_that_is_not_a_sweep(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check of a sweep left out every override with a comma, a dict of arguments included."""
    marker, sweep_dir = here / "pwned", here / "sweep"
    callback = f"+hydra.callbacks.evil={{_target_: {PAYLOAD}, path: {marker}}}"
    args = ["-m", "hparams_search=optuna", "hydra.sweeper.n_trials=1", "recipe=blobs", "debug=fast"]
    code, output = run_here([*args, callback, f"hydra.sweep.dir={sweep_dir}"], capsys)
    assert_refused(code, output, marker, sweep_dir)
    assert "hydra.callbacks.evil._target_" in output


def test_hydra_help_takes_no_overrides_or_presets(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--hydra-help`` composes without blocks' primary config and configures logging from what it is given."""
    marker, presets = here / "pwned", here / "presets"
    (presets / "debug").mkdir(parents=True)
    (presets / "debug" / "evil.yaml").write_text(
        "# @package _global_\n"
        f"hydra:\n  hydra_logging:\n    handlers:\n      evil:\n        '()': {PAYLOAD}\n        path: {marker}\n"
    )
    code, output = run_here(["--hydra-help", "--config-dir", str(presets), "+debug=evil"], capsys)
    assert_refused(code, output, marker, here / "outputs")
    assert "--hydra-help" in output
    code, output = run_here(["--cfg", "hydra", "--config-dir", str(presets), "debug=evil"], capsys)
    assert code == 2 and not marker.exists() and "hydra.hydra_logging.handlers.evil.()" in output


def test_a_config_cannot_open_the_allow_list_or_change_a_path_after_the_check(here: Path) -> None:
    """``hydra.job.env_set`` set the allow-list for the workers, and a path read from the environment
    was checked with one value and imported with another."""
    assert refused_keys(["+hydra.job.env_set.BLOCKS_ALLOW_IMPORTS=tests"]) == [
        "hydra.job.env_set.BLOCKS_ALLOW_IMPORTS"
    ]
    assert refused_keys(["+hydra.job.env_set.PYTHONWARNINGS=ignore::this.X"]) == [
        "hydra.job.env_set.PYTHONWARNINGS"
    ]
    adapter = [
        "model=torch_module",
        "+model.spec_args={in_features:num_features,num_classes:num_classes}",
        "model.target=blocks.model.networks.Decoder",
    ]
    env_target = '+model.kwargs.x={_target_: "${oc.env:EVIL_TARGET,blocks.spec.errors.Problem}"}'
    assert refused_keys([*adapter, env_target]) == ["model.kwargs.x._target_"]
    assert refused_keys(["+hydra.callbacks.x._target_=${oc.env:EVIL_TARGET,blocks.Foo}"]) == [
        "hydra.callbacks.x._target_"
    ]
    assert refused_keys(["++hydra.job.env_set='${oc.create:{PYTHONPATH:/x}}'"]) == [
        "hydra.job.env_set.PYTHONPATH"
    ]
    via_another_node = ["++hydra.foo={BLOCKS_ALLOW_IMPORTS:tests}", "++hydra.job.env_set=${hydra.foo}"]
    assert refused_keys(via_another_node) == ["hydra.job.env_set.BLOCKS_ALLOW_IMPORTS"]
    assert refused_keys(["hydra.job.chdir=${checkpoint.enabled}"]) == ["hydra.job.chdir"]
    for fine in ("OMP_NUM_THREADS=2", "PYTHONHASHSEED=0", "HYDRA_FULL_ERROR=1"):
        assert jobs.plan(["recipe=blobs", f"+hydra.job.env_set.{fine}"]).ok, fine


def test_a_config_sets_only_variables_that_tune_a_process_or_that_the_user_allows(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``env_set`` was a deny-list, and the list was never complete: ``RAY_RUNTIME_ENV_HOOK`` made
    Ray import and call any module by path in a sweep's jobs on Ray (outside the import seam), and
    NCCL's tuner and profiler plugins and NVTX's injection library load a shared library."""
    monkeypatch.delenv("BLOCKS_ALLOW_ENV", raising=False)
    for never in ("RAY_RUNTIME_ENV_HOOK=this.x", "NCCL_TUNER_PLUGIN=x", "NVTX_INJECTION64_PATH=/x.so"):
        assert refused_keys([f"+hydra.job.env_set.{never}"]) == [f"hydra.job.env_set.{never.split('=')[0]}"]
    assert refused_keys(["+hydra.job.env_set.MY_SETTING=1"]) == ["hydra.job.env_set.MY_SETTING"]
    # a family's members that name a location: CUDA_HOME picks the nvcc a JIT extension runs,
    # NCCL's debug file is overwritten wherever it points
    # TORCH_LOGS imports the modules it names (+this.x prints the Zen of Python)
    assert refused_keys(["+hydra.job.env_set.TORCH_LOGS=+this.x"]) == ["hydra.job.env_set.TORCH_LOGS"]
    located = ("CUDA_HOME=/x", "NCCL_DEBUG_FILE=/x", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/x")
    located += ("GLOO_DEVICE_TRANSPORT_TCP_TLS_PKEY=/x", "NCCL_COMM_ID=evil:1234", "NCCL_RAS_ADDR=evil:1")
    for name in located:
        assert refused_keys([f"+hydra.job.env_set.{name}"]) == [f"hydra.job.env_set.{name.split('=')[0]}"]
    for tuning in ("NCCL_DEBUG=INFO", "CUDA_DEVICE_MAX_CONNECTIONS=1", "TORCH_NCCL_BLOCKING_WAIT=1"):
        assert jobs.plan(["recipe=blobs", f"+hydra.job.env_set.{tuning}"]).ok, tuning

    monkeypatch.setenv("BLOCKS_ALLOW_ENV", "MY_*,RAY_*")  # the user's own settings open a family
    assert jobs.plan(["recipe=blobs", "+hydra.job.env_set.MY_SETTING=1"]).ok
    assert refused_keys(["+hydra.job.env_set.RAY_RUNTIME_ENV_HOOK=this.x"]) == [
        "hydra.job.env_set.RAY_RUNTIME_ENV_HOOK"
    ]  # a hook never
    monkeypatch.delenv("BLOCKS_ALLOW_ENV")
    (here / "pyproject.toml").write_text('[tool.blocks]\nallow_env = ["MY_SETTING"]\n')
    assert jobs.plan(["recipe=blobs", "+hydra.job.env_set.MY_SETTING=1"]).ok
    assert refused_keys(["+hydra.job.env_set.MY_OTHER=1"]) == ["hydra.job.env_set.MY_OTHER"]


def test_slurm_options_of_the_submitit_launcher_neither_run_code_nor_set_what_env_set_may_not(
    here: Path,
) -> None:
    """submitit writes the launcher's options into a bash script: ``additional_parameters`` as
    ``#SBATCH --key=value`` lines (``export=ALL,PYTHONWARNINGS=ignore::this.X`` set a variable
    env_set may not; ``get_user_env`` reads a login shell), any other key it is given is passed on
    (``teardown`` is shell, ``srun_args`` srun's options), and a line break in a value or a key
    starts a command. Slurm also reads any unambiguous prefix of an option, and a key with a space
    carries a second option: so the options are an allow-list."""
    slurm = ["hydra/launcher=submitit_slurm"]

    def refused(override: str) -> list[str]:
        return refused_keys([*slurm, override])

    params = "hydra.launcher.additional_parameters"
    assert refused(f"+{params}={{export: 'ALL,PYTHONWARNINGS=ignore::this.X'}}") == [f"{params}.export"]
    assert refused(f"+{params}={{get_user_env: 1, mail_type: ALL}}") == [f"{params}.get_user_env"]
    assert refused(f"+{params}={{get_user: true}}") == [f"{params}.get_user"]  # an abbreviation
    assert refused(f"+{params}={{comment c --chdir: /tmp/evil}}") == [f"{params}.comment c --chdir"]
    assert refused(f"+{params}={{comment: 'x\necho PWNED #'}}") == [f"{params}.comment"]
    assert refused("hydra.job.name='x\necho PWNED'") == ["hydra.launcher.name"]
    assert refused("+hydra.launcher.teardown=['touch /tmp/x']") == ["hydra.launcher.teardown"]
    assert refused("+hydra.launcher.srun_args=['-lD/tmp/evil']") == ["hydra.launcher.srun_args"]
    assert refused("+hydra.launcher.srun_args={--chdir: 1}") == ["hydra.launcher.srun_args"]
    assert refused("hydra.launcher.setup=['echo hi']") == ["hydra.launcher.setup"]
    for fine in (
        f"+{params}={{export: 'ALL,NCCL_DEBUG=INFO', mail_type: END, time: '1:00:00', gpus_per_task: 1}}",
        "hydra.launcher.partition=gpu",
        "hydra.job.name='with\ta tab'",
    ):
        assert jobs.plan(["recipe=blobs", *slurm, fine]).ok, fine
    for launcher in ("submitit_local", "joblib", "ray"):
        assert jobs.plan(["recipe=blobs", f"hydra/launcher={launcher}"]).ok, launcher


def test_interpolations_elsewhere_are_not_resolved_by_the_checks(here: Path) -> None:
    """The checks resolve only what builds nodes or sets the environment: ``hydra.overrides`` holds
    each override's interpolation as text, which must stay unresolved (relative ones fail there)."""
    for override in ("trainer.val_every=${.max_steps}", "hydra.run.dir=runs/${hydra:job.name}"):
        assert jobs.plan(["recipe=blobs", override]).ok, override


def test_a_config_cannot_move_the_project_run_shell_lines_or_import_a_package_for_its_configs(
    here: Path,
) -> None:
    """``hydra.job.chdir`` made the workers read the project above the run dir; submitit's ``setup``
    is shell in the job script; ``pkg://`` imports any module to look for configs in it."""
    assert refused_keys(["hydra.job.chdir=true"]) == ["hydra.job.chdir"]
    setup = ["hydra/launcher=submitit_slurm", f"hydra.launcher.setup=['touch {here / 'pwned'}']"]
    assert refused_keys(setup) == ["hydra.launcher.setup"]
    assert refused_keys(["hydra.searchpath=[pkg://this]"]) == ["hydra.searchpath"]
    assert refused_keys(["hydra.searchpath=[pkg://IPython/__main__]"]) == ["hydra.searchpath"]
    assert not (here / "pwned").exists()
