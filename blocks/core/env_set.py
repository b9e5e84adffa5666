"""Which environment variables a config may set (``hydra.job.env_set``): an allow-list.

Hydra sets ``hydra.job.env_set`` in the driver before the job runs, and every process of the
job inherits it. An environment variable can make a process load a library (``LD_PRELOAD``,
NCCL's plugins, CUDA's and NVTX's injection libraries), import and call a module by path
(Ray's ``RAY_RUNTIME_ENV_HOOK``), run a command (``BASH_ENV``) or trust another certificate;
no list of such variables is ever complete. So a config may set only the variables known to
tune a process (threads, visible devices, the allocator, NCCL's and gloo's settings, torch's
debug output), plus those the user allows in their *own* settings, never in a config:

* the environment variable ``BLOCKS_ALLOW_ENV`` (comma-separated names; ``NAME_*`` allows a
  family), and/or
* ``[tool.blocks] allow_env = ["MYLAB_*"]`` in the project's ``pyproject.toml``.

Variables that load or run code, or change what blocks trusts, are refused whatever is allowed.
"""

from __future__ import annotations

from collections.abc import Iterable

from blocks.spec.errors import Problem
from blocks.spec.imports import user_list

ENV_VAR = "BLOCKS_ALLOW_ENV"

TUNING_NAMES = frozenset(
    {
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        "PYTORCH_NVML_BASED_CUDA_CHECK",
        "CUBLAS_WORKSPACE_CONFIG",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "CUDA_MODULE_LOADING",
        "TORCH_DISTRIBUTED_DEBUG",
        "TORCH_SHOW_CPP_STACKTRACES",
        "TORCH_CPP_LOG_LEVEL",
        "TORCH_USE_CUDA_DSA",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONFAULTHANDLER",
        "PYTHONIOENCODING",
        "PYTHONDONTWRITEBYTECODE",
        "HYDRA_FULL_ERROR",
        "TZ",
    }
)
"""Variables a config may set: each only tunes a process (threads, allocator, debug output, offline mode)."""
TUNING_FAMILIES = ("NCCL_", "TORCH_NCCL_", "GLOO_")
"""Families a config may set, but for a member that names a file, a directory, a library, a
plugin, a key or an address (:data:`LOCATION_SUFFIXES`: a debug file NCCL would overwrite, a
topology to read, gloo's TLS key, where NCCL listens) and the members of :data:`NEVER_NAMES`."""
LOCATION_SUFFIXES = (
    "_FILE",
    "_PATH",
    "_DIR",
    "_HOME",
    "_PLUGIN",
    "_LIB",
    "_LIBRARY",
    "_LIBRARIES",
    "_CONF",
    "_CERT",
    "_PKEY",
    "_KEY",
    "_CA",
    "_ADDR",
    "_ADDRESS",
)

NEVER_PREFIXES = ("BLOCKS_", "PYTHON", "LD_", "DYLD_", "HYDRA_", "GIT_")
NEVER_NAMES = frozenset(
    {
        "PATH",
        "BASH_ENV",
        "ENV",
        "HOME",
        "OPENSSL_CONF",
        "OPENSSL_ENGINES",
        "OPENSSL_MODULES",
        "GCONV_PATH",
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN",
        "NCCL_ENV_PLUGIN",
        "NCCL_CONF_FILE",
        "NCCL_COMM_ID",
        "CUDA_INJECTION64_PATH",
        "CUDA_INJECTION32_PATH",
        "NVTX_INJECTION64_PATH",
        "NVTX_INJECTION32_PATH",
        "OMP_TOOL_LIBRARIES",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "AWS_CA_BUNDLE",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
    }
)
"""Refused whatever the user allows: blocks' own settings (the import allow-list), Hydra's, what
makes a process load code or run a command (Python's, the loader's, git's, OpenSSL's, glibc's,
NCCL's, CUDA's, NVTX's and OpenMP's plugins and configuration files, the user site directory under
``HOME``, an AWS profile's ``credential_process``) and whom it trusts (certificate bundles);
also every variable whose name says it names a hook (Ray imports and calls ``RAY_*_HOOK`` by path)."""


def env_set_problems(names: Iterable[str]) -> list[Problem]:
    """A problem for each variable of ``hydra.job.env_set`` a config may not set (the user's allowance: :func:`allowed_env`)."""
    allowed = allowed_env()
    problems = []
    for name in names:
        if never_settable(name):
            problems.append(
                Problem(
                    f"hydra.job.env_set.{name}",
                    f"a config may not set {name}: it changes what blocks trusts or what the job's "
                    "processes load and run",
                    f"set {name} in your own environment before `blocks run`, not in the config",
                    check="import-denied",
                )
            )
        elif not (name in TUNING_NAMES or _in_tuning_family(name) or _matches(name, allowed)):
            problems.append(
                Problem(
                    f"hydra.job.env_set.{name}",
                    f"a config may set only environment variables known to tune a process "
                    f"(threads, devices, the allocator, NCCL_*, GLOO_*), and those you allow; "
                    f"{name} is neither",
                    f"set {name} in your own environment before `blocks run`; or, if configs may set it, "
                    f"allow it in your own settings: export {ENV_VAR}={name}, or "
                    f'[tool.blocks] allow_env = ["{name}"] in your pyproject.toml',
                    check="env-not-allowed",
                )
            )
    return problems


def allowed_env() -> tuple[str, ...]:
    """The variables (and ``NAME_*`` families) the user allows configs to set."""
    return user_list(ENV_VAR, "allow_env", "environment variable names", '["MYLAB_*"]')


def never_settable(name: str) -> bool:
    """Whether a config may never set *name*, whatever the user allows (:data:`NEVER_NAMES`)."""
    if name in TUNING_NAMES:
        return False
    return name.startswith(NEVER_PREFIXES) or name in NEVER_NAMES or "HOOK" in name.upper()


def _in_tuning_family(name: str) -> bool:
    return name.startswith(TUNING_FAMILIES) and not name.endswith(LOCATION_SUFFIXES)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in patterns)
