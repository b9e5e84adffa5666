"""Bad input found by fuzzing ``blocks plan`` (issue 14): each case ends in exit 2 naming the key, never a traceback.

Planned in this process through the real CLI entry (``blocks.cli.main.run_captured``): the
same parsing, composition, plan and rendering as ``python -m blocks plan``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from blocks.cli.main import run_captured
from blocks.core import jobs
from blocks.core.checks import CPU, GPU
from blocks.spec.errors import BlocksError, Problem
from tests.conftest import run_cli, run_in_process


@contextlib.contextmanager
def hang_guard(seconds: int = 60) -> Iterator[None]:
    """Fail instead of hanging the suite (a generous guard, not a speed assertion)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"planning took more than {seconds}s: it hangs")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def plan_cli(*args: str) -> tuple[int, str]:
    """``blocks plan ARGS`` in this process: (exit status, output)."""
    with hang_guard():
        code, output = run_captured(["plan", *args])
    assert "Traceback" not in output, output
    return code, output


def problems(*overrides: str) -> list[Problem]:
    """Every problem planning *overrides* reports, composition errors included."""
    try:
        return list(jobs.plan(list(overrides), CPU).problems)
    except BlocksError as error:
        return error.problems


def problem_on(key: str, *overrides: str) -> Problem:
    found = [p for p in problems(*overrides) if p.key == key and p.is_error]
    assert found, f"no error on {key}: {problems(*overrides)}"
    return found[0]


# tracebacks


def test_a_huge_device_count_is_an_error_not_a_division_by_zero() -> None:
    code, output = plan_cli("trainer.devices=99999999999999999999")
    assert code == 2
    assert "trainer.devices" in output


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_a_non_finite_device_memory_is_an_error(value: str) -> None:
    code, _ = plan_cli(f"trainer.device_memory_gb={value}")
    assert code == 2
    assert problem_on("trainer.device_memory_gb", f"trainer.device_memory_gb={value}").check == "finite"


def test_a_device_memory_that_overflows_bytes_plans() -> None:
    code, output = plan_cli("trainer.device_memory_gb=1e308")
    assert code in (0, 2), output


def test_a_list_for_a_config_group_is_an_error_naming_the_group() -> None:
    code, _ = plan_cli("strategy=[1,2]")
    assert code == 2
    problem = problem_on("strategy", "strategy=[1,2]")
    assert "one name" in problem.message
    assert "blocks list strategy" in problem.fix


def test_a_huge_prime_width_plans_at_once() -> None:
    code, output = plan_cli("model.d_model=1000000007")
    assert code == 2
    assert "model.n_heads" in output


# accepted by the plan, crashed the run


@pytest.mark.parametrize("seed", ["-1", str(2**32), str(2**63)])
def test_a_seed_outside_uint32_is_a_plan_error(seed: str) -> None:
    problem = problem_on("trainer.seed", f"trainer.seed={seed}")
    assert "4294967295" in problem.message
    assert problem.fix.startswith("trainer.seed=")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_nan_and_inf_fail_float_fields_of_every_kind(value: str) -> None:
    for key in ("optim.lr", "model.dropout", "monitor.grad_spike_factor", "trainer.device_memory_gb"):
        problem = problem_on(key, f"{key}={value}")
        assert problem.check == "finite", problem
        assert "finite" in problem.message


def test_an_edge_seed_plans() -> None:
    assert not [p for p in problems("trainer.seed=4294967295", "trainer.seed=0") if p.is_error]


# ignored silently


@pytest.mark.parametrize(
    ("override", "key", "hint"),
    [
        ("+max_steps=3", "max_steps", "trainer.max_steps"),
        ("+foo=1", "foo", "<group>.<key>"),
        ("+_target_=os.system", "_target_", ""),
        ("++seed=3", "seed", "trainer.seed"),
    ],
)
def test_a_new_key_at_the_root_is_an_error_naming_it(override: str, key: str, hint: str) -> None:
    code, output = plan_cli(override)
    assert code == 2, output
    problem = problem_on(key, override)
    assert "not a config group" in problem.message
    assert hint in problem.fix


def test_hydra_own_additions_still_work() -> None:
    code, output = plan_cli("+hydra.job.env_set.OMP_NUM_THREADS=1", "++hydra.job.name=x")
    assert code == 0, output


# parse errors


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("optim.lr=a=b", "optim.lr"),
        ("optim.lr==", "optim.lr"),
        ("optim.lr='x", "optim.lr"),
        ("data.path=a(b", "data.path"),
        ("data.path=a{b", "data.path"),
        ("optim.lr=[", "optim.lr"),
        ("=1", "=1"),
        ("justakey", "justakey"),
    ],
)
def test_a_parse_error_names_the_override_and_how_to_quote(override: str, key: str) -> None:
    code, _ = plan_cli(override)
    assert code == 2
    problem = problem_on(key, override)
    assert f"'{override}'" in problem.message
    assert problem.check == "override-syntax"
    if "=" in override[1:]:
        assert "quote" in problem.fix


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_parse_error_in_a_sweep_names_the_override(command: str) -> None:
    with hang_guard():
        code, output = run_captured(
            [command, "-m", "recipe=blobs", "optim.lr=a=b", "optim.weight_decay=0,0.1"]
        )
    assert code == 2
    assert "Traceback" not in output
    assert "error optim.lr: cannot parse the override 'optim.lr=a=b'" in output


def test_other_overrides_are_still_checked_next_to_a_parse_error() -> None:
    found = problems("optim.lr=a=b", "optim.schedule=cosin")
    assert {p.key for p in found if p.is_error} >= {"optim.lr", "optim.schedule"}


# search path


def test_a_user_searchpath_keeps_the_shipped_presets() -> None:
    code, output = plan_cli("hydra.searchpath=[file:///nonexistent-blocks-conf]", "debug=fast")
    assert code == 0, output


def test_blocks_run_keeps_the_shipped_presets_with_a_user_searchpath(tmp_path: Path) -> None:
    result = run_cli(
        ["run", "--cfg", "job", "hydra.searchpath=[file:///nonexistent-blocks-conf]", "debug=fast"],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.output
    assert "max_steps" in result.stdout


def test_a_group_without_options_does_not_suggest_itself() -> None:
    from blocks.core.compose import _unknown_key_problem

    problem = _unknown_key_problem("debug", {})
    assert "did you mean 'debug'" not in problem.message
    assert "search path" in problem.message


# rich markup


def test_a_failure_reason_with_markup_prints_literally(capsys: pytest.CaptureFixture[str]) -> None:
    from blocks.launch.run_dir import Summary
    from blocks.launch.worker import _print_summary

    reason = "ValueError: bad path [/etc] and [bold]x[/bold] [/]"
    _print_summary(
        Summary(status="failed", reason=reason, resumed_from="s3://b/[/x]", metrics={"val/[/m]": 1.0})
    )
    out = capsys.readouterr().out
    assert "[/etc]" in out
    assert "[bold]x[/bold]" in out
    assert "s3://b/[/x]" in out
    assert "val/[/m]" in out


def test_a_plan_title_with_markup_in_the_recipe_prints_literally() -> None:
    from rich.console import Console

    from blocks.cli.render import plan_panel

    plan = jobs.plan(["recipe=blobs"], CPU)
    plan = type(plan)(plan.blocks, {**plan.choices, "recipe": "odd[/x]"}, plan.derived, plan.problems)
    console = Console(record=True, width=200, file=open(os.devnull, "w"))  # noqa: SIM115 - closed below
    console.print(plan_panel(plan))
    console.file.close()
    assert "odd[/x]" in console.export_text()


# small


def test_exported_weights_follow_the_umask(tmp_path: Path) -> None:
    import torch

    from blocks.checkpoint.weights import save_weights

    previous = os.umask(0o022)
    try:
        save_weights({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "model.safetensors").stat().st_mode) == 0o644


def test_submitit_tasks_per_node_must_be_one() -> None:
    problem = problem_on(
        "hydra.launcher.tasks_per_node", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2"
    )
    assert problem.fix == "hydra.launcher.tasks_per_node=1"


def test_submitit_gpus_per_node_must_match_devices() -> None:
    args = ("hydra/launcher=submitit_slurm", "strategy=ddp", "trainer.devices=8", "trainer.accelerator=gpu")
    problem = problem_on("hydra.launcher.gpus_per_node", *args, "hydra.launcher.gpus_per_node=4")
    assert "trainer.devices=8" in problem.message
    assert "hydra.launcher.gpus_per_node=8" in problem.fix
    unset = problem_on("hydra.launcher.gpus_per_node", *args)
    assert "no GPUs" in unset.message
    assert not [p for p in problems(*args, "hydra.launcher.gpus_per_node=8") if p.is_error]


def test_fsdp_cpu_offload_on_a_cpu_job_is_a_plan_error_not_a_worker_crash() -> None:
    """FSDP2's CPU offload needs an accelerator: refused at plan time (exit 2), planned on GPUs."""
    args = ("recipe=tiny_lm", "strategy=fsdp", "trainer.devices=2", "strategy.cpu_offload=true")
    problem = problem_on("strategy.cpu_offload", *args)
    assert problem.check == "fsdp-cpu-offload-accelerator"
    assert "strategy.cpu_offload=false" in problem.fix
    code, output = plan_cli(*args)
    assert code == 2 and "strategy.cpu_offload=false" in output
    on_gpus = jobs.plan([*args, "trainer.accelerator=gpu"], GPU).problems
    assert not [p for p in on_gpus if p.is_error], on_gpus


def test_an_unknown_key_fix_uses_the_right_article() -> None:
    problem = problem_on("optim.momentum", "optim.momentum=0.9")
    assert "choose an optim block" in problem.fix


def test_a_zero_grad_clip_says_null_turns_clipping_off() -> None:
    problem = problem_on("optim.grad_clip", "optim.grad_clip=0")
    assert "optim.grad_clip=null" in problem.fix


# metric names (issue 14, silent wrong answers)


def test_a_misspelled_objective_is_a_plan_error_with_did_you_mean() -> None:
    problem = problem_on("monitor.objective", "recipe=digits_mlp", "monitor.objective=val/acuracy")
    assert problem.check == "objective-metric"
    assert "did you mean 'val/accuracy'" in problem.message
    assert problem.fix == "monitor.objective=val/accuracy"


def test_a_misspelled_checkpoint_monitor_has_did_you_mean() -> None:
    problem = problem_on("checkpoint.monitor", "checkpoint.monitor=val/los")
    assert "did you mean 'val/loss'" in problem.message


@pytest.mark.parametrize("objective", ["train/loss", "val/perplexity", "tokens_per_s", "lr"])
def test_logged_metrics_are_valid_objectives(objective: str) -> None:
    assert not [p for p in problems(f"monitor.objective={objective}") if p.key == "monitor.objective"]


def test_a_validation_objective_without_a_validation_split_warns() -> None:
    found = [p for p in problems("recipe=blobs", "data.val_fraction=0") if p.key == "monitor.objective"]
    assert [p.check for p in found] == ["objective-validation"]
    assert not found[0].is_error


def test_a_maximized_validation_objective_without_a_validation_split_is_an_error() -> None:
    """A sweeper maximizing ``val/accuracy`` got ``train/loss`` from each job, and picked the worst model."""
    problem = problem_on(
        "monitor.objective",
        "recipe=blobs",
        "data.val_fraction=0",
        "monitor.objective=val/accuracy",
        "monitor.objective_mode=max",
    )
    assert problem.check == "objective-validation"
    assert "no validation split" in problem.message and "maximized" in problem.message
    assert "data.val_fraction=0.1" in problem.fix and "monitor.objective_mode=min" in problem.fix


# where the run dir goes (an unset shell variable, a file, an interpolation)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("hydra.run.dir=", "hydra.run.dir"),
        ("hydra.sweep.dir=", "hydra.sweep.dir"),
        ("hydra.run.dir=${nosuch}", "hydra.run.dir"),
        ("hydra.run.dir=${oc.env:BLOCKS_TEST_NEVER_SET}", "hydra.run.dir"),
        ("hydra.run.dir=/x/${hydra:nosuch}", "hydra.run.dir"),
        ("hydra.sweep.dir=${nosuch}", "hydra.sweep.dir"),
        ("hydra.sweep.subdir=${nosuch}", "hydra.sweep.subdir"),
    ],
)
def test_a_run_dir_that_is_empty_or_unresolvable_is_an_error(override: str, key: str) -> None:
    sweep = ["-m"] if key.startswith("hydra.sweep.") else []  # a single run never reads hydra.sweep.*
    code, output = plan_cli(*sweep, "recipe=blobs", override)
    assert code == 2, output
    problem = problem_on(key, "recipe=blobs", override)
    assert problem.fix.startswith(key) or "BLOCKS_TEST_NEVER_SET" in problem.fix


def test_a_run_dir_at_or_under_a_file_is_an_error(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for override, key in (
        (f"hydra.run.dir={afile}", "hydra.run.dir"),
        (f"hydra.run.dir={afile}/x", "hydra.run.dir"),
        (f"hydra.sweep.dir={afile}", "hydra.sweep.dir"),
    ):
        assert "is a file" in problem_on(key, "recipe=blobs", override).message


def test_only_the_dir_of_the_mode_that_runs_is_checked(tmp_path: Path) -> None:
    """Regression: files named ``outputs`` and ``multirun`` where blocks starts (the default dirs'
    parents) refused a sweep over ``hydra.run.dir``, and a single run's plan over ``hydra.sweep.dir``."""
    for name in ("outputs", "multirun"):
        (tmp_path / name).write_text("mine")
    for args in (
        ["plan", "-m", "recipe=blobs", "optim.lr=1e-3,2e-3", f"hydra.sweep.dir={tmp_path}/sweep"],
        ["plan", "recipe=blobs", f"hydra.run.dir={tmp_path}/run"],
        ["run", "recipe=blobs", f"hydra.run.dir={tmp_path}/run", "--cfg", "job"],
    ):
        result = run_in_process(args, cwd=tmp_path)
        assert result.returncode == 0, result.output
    refused = run_in_process(["plan", "recipe=blobs"], cwd=tmp_path)  # its own dir is under the file
    assert refused.returncode == 2 and "hydra.run.dir" in refused.output, refused.output


def test_run_refuses_an_empty_run_dir_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("mine\n")
    for override in ("hydra.run.dir=", "hydra.run.dir=/proc/blocks-nope/x"):
        result = run_in_process(["run", "recipe=blobs", "trainer.max_steps=1", override], cwd=tmp_path)
        assert result.returncode == 2, result.output
        assert "hydra.run.dir" in result.output
        assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
    assert (tmp_path / "config.yaml").read_text() == "mine\n"


def test_a_preset_run_dir_that_cannot_resolve_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(
        "# @package _global_\nhydra:\n  run:\n    dir: ${nosuch}\n"
    )
    code, output = plan_cli("--config-dir", str(tmp_path), "recipe=blobs", "experiment=mine")
    assert code == 2, output
    assert "hydra.run.dir" in output


@pytest.mark.parametrize(
    "override",
    ["hydra.job_logging.root.level=NOPE", "hydra.hydra_logging.root.level=debug"],
)
def test_a_logging_level_that_is_not_one_is_an_error(override: str) -> None:
    key = override.split("=")[0]
    problem = problem_on(key, "recipe=blobs", override)
    assert "not a logging level" in problem.message
    assert f"{key}=INFO" in problem.fix
    assert not [
        p for p in problems("recipe=blobs", f"{key}=DEBUG", "hydra.job_logging.root.level=10") if p.is_error
    ]


def test_run_refuses_a_bad_logging_level_before_the_run_dir_exists(tmp_path: Path) -> None:
    result = run_in_process(
        ["run", "recipe=blobs", f"hydra.run.dir={tmp_path}/run", "hydra.job_logging.root.level=NOPE"],
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.output
    assert "hydra.job_logging.root.level" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["plan", "run"])
def test_appending_a_block_field_that_exists_is_refused_with_the_set_fix(
    command: str, tmp_path: Path
) -> None:
    for given in (["+trainer.max_steps=5"], ["trainer.max_steps=10", "+trainer.max_steps=5"]):
        result = run_in_process([command, "recipe=blobs", *given], cwd=tmp_path)
        assert result.returncode == 2, result.output
        assert "error trainer.max_steps: '+trainer.max_steps=5' adds trainer.max_steps" in result.output
        assert "fix: trainer.max_steps=5" in result.output
    assert list(tmp_path.iterdir()) == []


# flags among the overrides


def test_flags_may_come_between_overrides(tmp_path: Path) -> None:
    plan = run_in_process(["plan", "recipe=blobs", "--json", "optim.lr=0.1"], cwd=tmp_path)
    assert plan.returncode == 0, plan.output
    assert '"lr": 0.1' in plan.output
    sweep = run_in_process(
        ["run", "recipe=blobs", "-m", "optim.lr=0.1,0.2", "trainer.max_steps=0"], cwd=tmp_path
    )
    assert sweep.returncode == 2, sweep.output
    assert "no job of the sweep was started" in sweep.output and "error trainer.max_steps" in sweep.output
    for command in ("plan", "run"):
        unknown = run_in_process([command, "recipe=blobs", "--nosuch-flag", "optim.lr=0.1"], cwd=tmp_path)
        assert unknown.returncode == 2, unknown.output
        assert "--nosuch-flag" in unknown.output and "Traceback" not in unknown.output
    assert list(tmp_path.iterdir()) == []


# messages that named no key or gave a wrong fix


@pytest.mark.parametrize("override", ["~trainer.max_steps", "~model.init_from", "~data.batch_size"])
def test_deleting_a_block_field_says_fields_cannot_be_deleted(override: str) -> None:
    problem = problem_on(override.lstrip("~"), "recipe=blobs", override)
    assert "block fields cannot be deleted" in problem.fix
    assert "did you mean" not in problem.message


@pytest.mark.parametrize(
    ("override", "fix"),
    [
        ("optim.lr=${oc.env:BLOCKS_TEST_NEVER_SET}", "optim.lr='${oc.env:BLOCKS_TEST_NEVER_SET,<default>}'"),
        ("checkpoint.dir=${hydra:runtime.output_dir}/ck", "write checkpoint.dir's value itself"),
        ("optim.lr=${optim.nosuch}", "interpolate a key that exists"),
    ],
)
def test_an_interpolation_error_fix_does_not_point_at_itself(
    override: str, fix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(
        HydraConfig.instance(), "cfg", None
    )  # as in a fresh `blocks plan` (a run in this process set it)
    problem = problem_on(override.split("=")[0], "recipe=blobs", override)
    assert fix in problem.fix
    assert "optim.lr='${optim.lr}'" not in problem.fix


def test_config_dir_mistakes_name_the_option_or_the_file(tmp_path: Path) -> None:
    code, output = plan_cli("--config-dir", str(tmp_path / "nosuch"), "recipe=blobs")
    assert code == 2 and "error --config-dir:" in output and "is not a directory" in output, output
    (tmp_path / "optim").mkdir()
    (tmp_path / "optim" / "nobl.yaml").write_text("lr: 0.1\n")
    (tmp_path / "optim" / "utf16.yaml").write_bytes("lr: 0.1\n".encode("utf-16"))
    code, output = plan_cli("--config-dir", str(tmp_path), "recipe=blobs", "optim=nobl")
    flat = " ".join(output.split())
    assert (
        code == 2 and f"the optim preset 'nobl' ({tmp_path / 'optim' / 'nobl.yaml'}) has no _block_" in flat
    ), output
    code, output = plan_cli("--config-dir", str(tmp_path), "recipe=blobs", "optim=utf16")
    flat = " ".join(output.split())
    assert code == 2 and f"{tmp_path / 'optim' / 'utf16.yaml'} is not UTF-8 text" in flat, output


def test_a_rank_variable_that_is_no_integer_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "abc")
    result = run_in_process(
        ["run", "recipe=blobs", "trainer.max_steps=1", f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path
    )
    assert result.returncode == 2, result.output
    assert "error RANK:" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_a_pipeline_refuses_an_empty_run_dir(tmp_path: Path) -> None:
    for command in ("plan", "run"):
        result = run_in_process([command, "recipe=digits_pipeline", "hydra.run.dir="], cwd=tmp_path)
        assert result.returncode == 2, result.output
        assert "error hydra.run.dir: is empty" in result.output
    assert list(tmp_path.iterdir()) == []
