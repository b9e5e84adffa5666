"""Configs create registered blocks only; import paths need the user's own permission; dangerous ones never."""

from __future__ import annotations

from pathlib import Path

import pytest

from blocks.spec.errors import ConfigError
from blocks.spec.imports import allowed_prefixes, resolve
from tests.conftest import read_summary

ADAPTED = [
    "recipe=blobs",
    "model=torch_module",
    "+model.spec_args={in_features:num_features,num_classes:num_classes}",
]
FAST = ["data.samples=256", "trainer.max_epochs=1"]
ALLOW = ("BLOCKS_ALLOW_IMPORTS", "tests.legacy_team")
"""The environment variable that lets the legacy team's module be imported, and its value."""


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.target=os.system", "'os.system' is refused"),
        ("model.target=builtins.eval", "'builtins.eval' is refused"),
        ("model.target=subprocess.Popen", "'subprocess.Popen' is refused"),
        ("model.target=posixpath.os.system", "is refused"),
        (
            "+model.kwargs.act={_target_:builtins.exec}",
            "model.kwargs.act._target_: 'builtins.exec' is refused",
        ),
        ("model.target=tests.legacy_team.__class__", "is not an import path"),
    ],
)
def test_dangerous_paths_are_refused_at_plan_time_even_when_allowed(cli, override: str, message: str) -> None:
    env = {"BLOCKS_ALLOW_IMPORTS": "os,builtins,subprocess,posixpath,tests"}
    base = [a for a in ADAPTED if not a.startswith("model.target")]
    result = cli("plan", *base, "model.target=tests.legacy_team.TinyNet", override, env=env)
    assert result.returncode == 2
    assert message in result.output, result.output
    assert "Traceback" not in result.output


def test_a_free_target_key_is_not_a_block_field(cli) -> None:
    result = cli("plan", "recipe=blobs", "+model._target_=os.system")
    assert result.returncode == 2 and "has no field '_target_'" in result.output


def test_an_import_path_needs_the_users_permission(cli, tmp_path: Path) -> None:
    denied = cli("plan", *ADAPTED, "model.target=tests.legacy_team.TinyNet")
    assert denied.returncode == 2
    assert "'tests.legacy_team.TinyNet' is not in a module prefix you allow" in denied.output
    assert "BLOCKS_ALLOW_IMPORTS=tests" in denied.output and "allow_imports" in denied.output
    (tmp_path / "pyproject.toml").write_text('[tool.blocks]\nallow_imports = ["tests.legacy_team"]\n')
    allowed = cli("plan", *ADAPTED, "model.target=tests.legacy_team.TinyNet")
    assert allowed.returncode == 0, allowed.output
    assert allowed_prefixes(tmp_path) == ("tests.legacy_team",)


def test_aliases_are_resolved_and_refused_by_what_they_really_are() -> None:
    allowed = ["tests.legacy_team"]
    with pytest.raises(ConfigError, match=r"'tests.legacy_team.launch' is really posix.system"):
        resolve("tests.legacy_team.launch", "model.target", allowed)
    with pytest.raises(ConfigError, match=r"is really subprocess.Popen"):
        resolve("tests.legacy_team.Shell", "model.target", allowed)
    with pytest.raises(
        ConfigError, match=r"is really torch.nn.modules.linear.Linear.*not in a module prefix"
    ):
        resolve("tests.legacy_team.nn.Linear", "model.target", allowed)
    assert resolve("tests.legacy_team.TinyNet", "model.target", allowed).__name__ == "TinyNet"


def test_an_alias_is_refused_before_it_is_called(
    cli_in_process, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "pwned"
    monkeypatch.setenv(*ALLOW)
    result = cli_in_process(
        "run",
        *ADAPTED,
        *FAST,
        "model.target=tests.legacy_team.launch",
        f"+model.kwargs.command='touch {victim}'",
    )
    assert result.returncode != 0
    assert "is really posix.system" in result.output
    assert not victim.exists(), "the aliased os.system must never run"


@pytest.mark.slow
def test_an_existing_module_and_lightning_code_train_through_adapters(
    cli_in_process, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLOCKS_ALLOW_IMPORTS", "tests.legacy_team,torch.nn")
    plain = cli_in_process(
        "run",
        *ADAPTED,
        *FAST,
        "model.target=tests.legacy_team.TinyNet",
        "+model.kwargs={hidden:8,act:{_target_:torch.nn.Tanh}}",
        f"hydra.run.dir={tmp_path / 'plain'}",
    )
    assert plain.returncode == 0, plain.output[-3000:]
    assert read_summary(tmp_path / "plain")["status"] == "completed"
    monkeypatch.setenv(*ALLOW)
    lightning = cli_in_process(
        "run",
        "recipe=blobs",
        "model=torch_module",
        "model.target=tests.legacy_team.PlainLitNet",
        "data=lightning_data",
        "data.target=tests.legacy_team.ClustersDM",
        "data.num_features=8",
        "data.num_classes=3",
        "data.train_samples=192",
        "data.val_samples=64",
        "optim.lr=0.03",
        "trainer.max_epochs=2",
        f"hydra.run.dir={tmp_path / 'lightning'}",
    )
    assert lightning.returncode == 0, lightning.output[-3000:]
    summary = read_summary(tmp_path / "lightning")
    assert summary["status"] == "completed" and summary["global_step"] == 12
    assert summary["metrics"]["val/accuracy"] > 0.8, "the clusters are easy: it must learn"
    wrong = cli_in_process(
        "run",
        "recipe=blobs",
        "model=torch_module",
        "model.target=tests.legacy_team.PlainLitNet",
        "data=lightning_data",
        "data.target=tests.legacy_team.ClustersDM",
        "data.num_features=8",
        "data.num_classes=3",
        "data.train_samples=100",
        "trainer.max_epochs=1",
    )
    assert wrong.returncode != 0 and "data.train_samples=192" in wrong.output


def test_the_pyproject_is_parsed_once_per_content_and_followed_on_every_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.10 reads TOML with tomli
    parsed: list[str] = []
    real_loads = tomllib.loads
    monkeypatch.setattr(tomllib, "loads", lambda text: parsed.append(text) or real_loads(text))
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.blocks]\nallow_imports = ["tests.legacy_team"]\n')
    for _ in range(3):  # a plan resolves several import paths, each asking for the prefixes
        assert allowed_prefixes(tmp_path) == ("tests.legacy_team",)
    assert len(parsed) == 1
    pyproject.write_text('[tool.blocks]\nallow_imports = ["tests.legacy_tean"]\n')  # same size, same tick
    assert allowed_prefixes(tmp_path) == ("tests.legacy_tean",)
    pyproject.write_text("[tool.blocks]\n")
    assert allowed_prefixes(tmp_path) == ()
    pyproject.write_text("[tool.blocks]\nallow_imports = 3\n")
    for _ in range(2):  # a broken file is an error every time, not only the first
        with pytest.raises(ConfigError, match="allow_imports must be a list"):
            allowed_prefixes(tmp_path)
    pyproject.write_bytes(b"[tool.blocks]\nallow_imports = ['caf\xe9']\n")  # Latin-1, not UTF-8
    with pytest.raises(ConfigError, match="could not be read"):
        allowed_prefixes(tmp_path)
