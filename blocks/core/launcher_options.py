"""What a config may have a launcher write into each job's script: submitit's options, by allow-list.

submitit turns the launcher's options into a bash script that Slurm runs: ``#SBATCH --key=value``
lines (``additional_parameters`` among them: each value shell-quoted, each key as written),
``srun`` arguments, and ``setup``/``teardown`` lines of shell. A deny-list of Slurm's options
misses abbreviations (Slurm reads any unambiguous prefix), short options bundled together, site
plugins' options and keys that carry a second option, so what a config may set is listed:

* submitit's launcher takes only the options its Hydra config declares, ``setup`` (shell) aside;
  submitit would pass anything else on (``teardown``, ``srun_args``, ...);
* ``additional_parameters`` maps sbatch options of :data:`SBATCH_OPTIONS` (scheduling and
  accounting: time, memory, GPUs, mail, ...), each written out in full, to plain values;
  ``export`` may set only the variables ``hydra.job.env_set`` may set
  (:mod:`blocks.core.env_set`);
* no launcher option holds a line break (the rest of an ``#SBATCH`` line would run as a command).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import Container, DictConfig, OmegaConf

from blocks.core.env_set import env_set_problems
from blocks.spec.errors import Problem

SUBMITIT_CONFIGS = {
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": "SlurmQueueConf",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": "LocalQueueConf",
}
"""submitit's launchers, and the dataclass of ``hydra_plugins.hydra_submitit_launcher.config``
that declares each one's options."""
SBATCH_OPTIONS = frozenset(
    {
        "account",
        "acctg-freq",
        "begin",
        "clusters",
        "comment",
        "constraint",
        "contiguous",
        "core-spec",
        "cores-per-socket",
        "cpu-freq",
        "cpus-per-gpu",
        "cpus-per-task",
        "deadline",
        "delay-boot",
        "dependency",
        "distribution",
        "exclude",
        "exclusive",
        "extra-node-info",
        "gpu-bind",
        "gpu-freq",
        "gpus",
        "gpus-per-node",
        "gpus-per-socket",
        "gpus-per-task",
        "gres",
        "gres-flags",
        "hint",
        "hold",
        "job-name",
        "kill-on-invalid-dep",
        "licenses",
        "mail-type",
        "mail-user",
        "mem",
        "mem-bind",
        "mem-per-cpu",
        "mem-per-gpu",
        "mincpus",
        "network",
        "nice",
        "no-kill",
        "no-requeue",
        "nodelist",
        "nodes",
        "ntasks",
        "ntasks-per-core",
        "ntasks-per-gpu",
        "ntasks-per-node",
        "ntasks-per-socket",
        "overcommit",
        "oversubscribe",
        "partition",
        "power",
        "prefer",
        "priority",
        "profile",
        "qos",
        "reboot",
        "requeue",
        "reservation",
        "signal",
        "sockets-per-node",
        "spread-job",
        "switches",
        "thread-spec",
        "threads-per-core",
        "time",
        "time-min",
        "tmp",
        "use-min-nodes",
        "wait-all-nodes",
        "wckey",
    }
)
"""sbatch options a config may set through ``additional_parameters``: where and when the job
runs and what it is given, never what it runs, where it runs from, what environment it reads or
where Slurm writes."""
EXPORT = "export"
_SBATCH_KEY = re.compile(r"^[a-z][a-z0-9_-]*$")


def launcher_problems(hydra: DictConfig) -> list[Problem]:
    """Every option of ``hydra.launcher`` that would put a command or a foreign option into a job's script."""
    node = OmegaConf.select(hydra, "launcher", throw_on_missing=False)
    if not isinstance(node, DictConfig):
        return []
    launcher = _resolved(node)
    problems = [
        Problem(
            f"hydra.launcher.{path}",
            "holds a line break: a launcher writes its options into each job script, where the "
            "rest of the line would run as a shell command",
            f"write hydra.launcher.{path} on one line",
            check="import-denied",
        )
        for path, text in _texts(launcher, "")
        if any(ord(char) < 32 and char != "\t" for char in text)
    ]
    declared = _declared_options(launcher.get("_target_"))
    if declared is None:
        return problems
    for name in launcher:
        if name == "setup" and launcher[name]:
            problems.append(_setup_problem())
        elif name not in declared:
            problems.append(
                Problem(
                    f"hydra.launcher.{name}",
                    "is not an option of submitit's launcher config: submitit would pass it on to "
                    "Slurm or into the job script",
                    f"drop hydra.launcher.{name}; its options are {', '.join(sorted(declared - {'_target_'}))}",
                    check="import-denied",
                )
            )
    return problems + _sbatch_problems(launcher.get("additional_parameters"))


def _declared_options(target: Any) -> frozenset[str] | None:
    """The options submitit's launcher *target* declares; None for any other launcher."""
    config = SUBMITIT_CONFIGS.get(str(target))
    if config is None:
        return None
    module = importlib.import_module("hydra_plugins.hydra_submitit_launcher.config")
    return frozenset(field.name for field in dataclasses.fields(getattr(module, config)))


def _sbatch_problems(additional: Any) -> list[Problem]:
    """``additional_parameters``: a mapping of listed sbatch options to plain values."""
    key = "hydra.launcher.additional_parameters"
    if additional is None:
        return []
    if not isinstance(additional, Mapping):
        return [
            Problem(
                key, "must map sbatch options to values", f"{key}={{mail_type: END}}", check="import-denied"
            )
        ]
    problems = []
    for name, value in additional.items():
        here, option = f"{key}.{name}", str(name).replace("_", "-")
        if isinstance(value, (Mapping, list)):
            problems.append(
                Problem(here, "must be a plain value", f"{here}=<one value>", check="import-denied")
            )
        elif option == EXPORT and _SBATCH_KEY.match(str(name)):
            names = [item.split("=", 1)[0] for item in str(value).split(",") if "=" in item]
            problems += [
                Problem(
                    here, f"{problem.message} (through Slurm's --export)", problem.fix, check=problem.check
                )
                for problem in env_set_problems(names)
            ]
        elif option not in SBATCH_OPTIONS or not _SBATCH_KEY.match(str(name)):
            problems.append(
                Problem(
                    here,
                    "is not an sbatch option a config may set (sbatch's options that run "
                    "something, read an environment, move the job or choose where Slurm writes are "
                    "not; each option is written out in full)",
                    f"drop {here}, or pass it to sbatch yourself (your site's defaults or wrapper); "
                    f"a config may set: {', '.join(sorted(SBATCH_OPTIONS | {EXPORT}))}",
                    check="import-denied",
                )
            )
    return problems


def _setup_problem() -> Problem:
    return Problem(
        "hydra.launcher.setup",
        "the launcher would run these lines as shell commands in each job script; a config may not run commands",
        "run them before `blocks run` (jobs inherit the environment you submit from), or in your shell "
        "profile, and drop hydra.launcher.setup",
        check="import-denied",
    )


def _resolved(node: DictConfig) -> dict[str, Any]:
    """The launcher's options as Hydra will resolve them; one that cannot be resolved now stays as written.

    (``${hydra.job.num}`` is set per job, after this check.)
    """
    options: dict[str, Any] = {}
    for name in node:
        try:
            value = node[name]
            options[str(name)] = (
                OmegaConf.to_container(value, resolve=True) if isinstance(value, Container) else value
            )
        except Exception:  # resolving may fail in any of OmegaConf's or a resolver's ways
            options[str(name)] = OmegaConf.to_container(node, resolve=False)[name]  # type: ignore[index]
    return options


def _texts(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """``(dotted path, text)`` of every key and string in a plain container."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for name, item in value.items():
            here = f"{path}.{name}" if path else str(name)
            yield here, str(name)
            yield from _texts(item, here)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _texts(item, f"{path}[{index}]")
