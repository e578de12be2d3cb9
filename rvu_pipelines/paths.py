"""Where the project keeps its configs and its local state (DAGSTER_HOME, MLflow, outputs)."""

from __future__ import annotations

from pathlib import Path

from rvu_pipelines.settings import env_value

PROJECT_ROOT_ENV = "RVU_PROJECT_ROOT"
STATE_DIR_ENV = "RVU_HOME"
CONFIG_DIR_ENV = "RVU_CONFIG_DIR"


def project_root() -> Path:
    """The checkout the library runs from (override with RVU_PROJECT_ROOT)."""
    override = env_value(PROJECT_ROOT_ENV)
    return Path(override).resolve() if override else Path(__file__).resolve().parents[1]


def config_dir() -> Path:
    """The folder holding models.yaml, datasets.yaml and the other YAML configs."""
    override = env_value(CONFIG_DIR_ENV)
    return Path(override).resolve() if override else project_root() / "configs"


def state_dir() -> Path:
    """Git-ignored local state: outputs, MLflow store, caches (override with RVU_HOME)."""
    override = env_value(STATE_DIR_ENV)
    path = Path(override).resolve() if override else project_root() / ".rvu"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir(kind: str) -> Path:
    """A per-kind download cache inside the state folder (datasets, models)."""
    path = state_dir() / "cache" / kind
    path.mkdir(parents=True, exist_ok=True)
    return path
