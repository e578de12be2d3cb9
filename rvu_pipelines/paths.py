"""Where the project keeps its configs, its local state (DAGSTER_HOME, MLflow, outputs) and its caches, and where
it may fetch data and models from (the public sources, or none when offline): the default locations, each
overridable by a setting, read here so the rest of the library receives them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.settings import env_value, is_offline

PROJECT_ROOT_ENV = "RVU_PROJECT_ROOT"
STATE_DIR_ENV = "RVU_HOME"
CONFIG_DIR_ENV = "RVU_CONFIG_DIR"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
INCIDENT_DIR_ENV = "RVU_INCIDENT_DIR"
SPECTRAL_CACHE_ENV = "RVU_SPECTRAL_CACHE"
PROVENANCE_STORE_ENV = "RVU_PROVENANCE_STORE"
DATA_MIRROR_ENV = "RVU_DATA_MIRROR"
KV_CACHE_DIR_ENV = "RVU_KV_CACHE_DIR"


def project_root() -> Path:
    """The checkout the library runs from (override with RVU_PROJECT_ROOT)."""
    override = env_value(PROJECT_ROOT_ENV)
    return Path(override).resolve() if override else Path(__file__).resolve().parents[1]


def config_dir() -> Path:
    """The folder holding models.yaml, datasets.yaml and the other YAML configs."""
    override = env_value(CONFIG_DIR_ENV)
    return Path(override).resolve() if override else project_root() / "configs"


def state_dir(*, create: bool = True) -> Path:
    """Git-ignored local state: outputs, MLflow store, caches (override with RVU_HOME). ``create=False`` only
    says where it is, for commands that must not leave folders behind on a machine that never ran anything."""
    override = env_value(STATE_DIR_ENV)
    path = Path(override).resolve() if override else project_root() / ".rvu"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir(kind: str) -> Path:
    """A per-kind download cache inside the state folder (datasets, models)."""
    path = state_dir() / "cache" / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_tracking_uri() -> str:
    """The MLflow tracking store (``MLFLOW_TRACKING_URI``, else a SQLite file in the state folder)."""
    return env_value(TRACKING_URI_ENV) or f"sqlite:///{state_dir() / 'mlflow.db'}"


def incident_inbox_dir() -> Path:
    """Where incident logs arrive for the recovery sensor (``RVU_INCIDENT_DIR``, else ``<state>/incidents``)."""
    return Path(env_value(INCIDENT_DIR_ENV) or state_dir() / "incidents")


def spectral_cache_dir() -> Path:
    """``RVU_SPECTRAL_CACHE`` (default ``~/.cache/rvu/spectral``): content-addressed things only (converted
    weights by GGUF sha256, calibrated switches by the hash of everything that made them), so a fresh state
    folder (a test session, a clean clone) does not pay for them again."""
    root = env_value(SPECTRAL_CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "rvu" / "spectral"


def shared_provenance_store() -> str | None:
    """``RVU_PROVENANCE_STORE``: a DuckDB file or PostgreSQL URL that workers share (the scale profile), if set."""
    return env_value(PROVENANCE_STORE_ENV) or None


def data_mirror() -> str | None:
    """``RVU_DATA_MIRROR``: a local folder laid out like the data mirror, read instead of the public sources."""
    return env_value(DATA_MIRROR_ENV)


def kv_prefix_dir() -> Path:
    """``RVU_KV_CACHE_DIR``: KV prefix states shared between processes (default ``<state>/cache/kv_prefixes``)."""
    return Path(env_value(KV_CACHE_DIR_ENV) or state_dir() / "cache" / "kv_prefixes")


def model_path_override(role: str) -> tuple[str, str | None] | None:
    """``RVU_MODEL_<ROLE>_PATH`` (and its pin ``RVU_MODEL_<ROLE>_SHA256``): a local file that stands in for the
    profile's model of that role, or None."""
    path = env_value(f"RVU_MODEL_{role.upper()}_PATH")
    return (path, env_value(f"RVU_MODEL_{role.upper()}_SHA256")) if path else None


@dataclass(frozen=True)
class PublicSources:
    """The public places data and models come from, and whether this machine may reach them at all.

    ``offline``: never reach any of them (fail fast, naming what is missing and how to provide it)."""

    offline: bool = False
    huggingface: str = "https://huggingface.co"
    github_raw: str = "https://raw.githubusercontent.com"
    pypi_index: str | None = None  # None: pip's configured index

    def __post_init__(self) -> None:
        object.__setattr__(self, "huggingface", self.huggingface.rstrip("/"))
        object.__setattr__(self, "github_raw", self.github_raw.rstrip("/"))


def public_sources() -> PublicSources:
    """The public sources as configured: ``RVU_OFFLINE`` (or HuggingFace's own switches), ``HF_ENDPOINT``,
    ``RVU_GITHUB_RAW_BASE`` and ``RVU_PYPI_INDEX_URL``."""
    defaults = PublicSources()
    return PublicSources(
        offline=is_offline(),
        huggingface=env_value("HF_ENDPOINT") or defaults.huggingface,
        github_raw=env_value("RVU_GITHUB_RAW_BASE") or defaults.github_raw,
        pypi_index=env_value("RVU_PYPI_INDEX_URL"),
    )
