"""Resource sets per deployment: the one place that decides which implementation backs each resource.

Assets name interfaces (``LLMResource``, ``DatasetSourceResource``, ...); a deployment binds them
(the project_fully_featured pattern). ``RVU_DEPLOYMENT`` chooses the set when the code location loads:

- ``local`` (default): the embedded defaults. Data from the mirror in RVU_DATA_MIRROR when set, else
  the public sources; llama.cpp in-process (or the server in RVU_LLM_BASE_URL when
  RVU_LLM_BACKEND=openai_compatible); MLflow in SQLite under .rvu/ unless MLFLOW_TRACKING_URI is set.
- ``offline_mirror``: an air-gapped machine with a data mirror. RVU_DATA_MIRROR is required, nothing
  reaches a hub (data or models), the LLM runs in-process.
- ``production``: shared services. The LLM server (RVU_LLM_BASE_URL, RVU_LLM_MODEL), the MLflow server
  (MLFLOW_TRACKING_URI) and the incident inbox (RVU_INCIDENT_DIR) are required; data from the public
  sources through the cache.

Values from the environment are bound as Dagster ``EnvVar``s, so they are read where the run executes
and the UI shows which variable a value came from, never the value. A variable a set requires is
checked when the set is built, so a missing one fails at load with its name, not mid-run.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from dagster import EnvVar

from resources.data_source import DatasetSourceResource, MirrorDatasetSourceResource, PublicDatasetSourceResource
from resources.embedder import EmbedderResource
from resources.io_manager import LocalTableIOManager
from resources.llm import LlamaCppLLMResource, LLMResource, OpenAICompatibleLLMResource
from resources.model_store import ModelStoreResource
from resources.recovery import RecoveryResource
from resources.tracker import MlflowTrackerResource
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.settings import env_value

DEPLOYMENT_ENV = "RVU_DEPLOYMENT"
DEFAULT_DEPLOYMENT = "local"
ResourceSet = dict[str, object]


def _optional(name: str) -> EnvVar | None:
    """``EnvVar(name)`` when the variable is set, else None (the resource's own default applies)."""
    return EnvVar(name) if env_value(name) else None


def _require(deployment: str, *names: str) -> None:
    missing = [name for name in names if not env_value(name)]
    if missing:
        raise ConfigError(
            f"{DEPLOYMENT_ENV}={deployment} needs {', '.join(missing)} set "
            f"(see README, Configuration); or use {DEPLOYMENT_ENV}=local for the embedded defaults."
        )


def _llm_extra_body() -> dict[str, float]:
    """RVU_LLM_EXTRA_BODY: a JSON object of numeric sampling fields sent with every request."""
    raw = env_value("RVU_LLM_EXTRA_BODY")
    if raw is None:
        return {}
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"RVU_LLM_EXTRA_BODY={raw!r} is not JSON ({error}); e.g. '{{\"repeat_penalty\": 1.0}}'."
        ) from None
    if not isinstance(body, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in body.items()
    ):
        raise ConfigError(
            f"RVU_LLM_EXTRA_BODY={raw!r}: give a JSON object of numeric sampling fields, e.g. "
            "'{\"repeat_penalty\": 1.0}'."
        )
    return {key: float(value) for key, value in sorted(body.items())}


def _openai_llm(model: EnvVar | None) -> OpenAICompatibleLLMResource:
    return OpenAICompatibleLLMResource(base_url=EnvVar("RVU_LLM_BASE_URL"), model=model, extra_body=_llm_extra_body())


def _local_llm() -> LLMResource:
    if env_value("RVU_LLM_BACKEND") == "openai_compatible":
        _require("local with RVU_LLM_BACKEND=openai_compatible", "RVU_LLM_BASE_URL")
        return _openai_llm(_optional("RVU_LLM_MODEL"))
    return LlamaCppLLMResource()


def _local_data() -> DatasetSourceResource:
    if env_value("RVU_DATA_MIRROR"):
        return MirrorDatasetSourceResource(mirror=EnvVar("RVU_DATA_MIRROR"))
    return PublicDatasetSourceResource()


def local_resources() -> ResourceSet:
    """The embedded defaults, each overridable by its environment variable."""
    return {
        "io_manager": LocalTableIOManager(),
        "data_source": _local_data(),
        "model_store": ModelStoreResource(),
        "llm": _local_llm(),
        "embedder": EmbedderResource(),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=_optional("MLFLOW_TRACKING_URI")),
        "recovery": RecoveryResource(incident_dir=_optional("RVU_INCIDENT_DIR")),
    }


def offline_mirror_resources() -> ResourceSet:
    """Air-gapped: every data set from the mirror, every model from its package or local path."""
    _require("offline_mirror", "RVU_DATA_MIRROR")
    return {
        **local_resources(),
        "data_source": MirrorDatasetSourceResource(mirror=EnvVar("RVU_DATA_MIRROR")),
        "model_store": ModelStoreResource(offline=True),
        "llm": LlamaCppLLMResource(),
    }


def production_resources() -> ResourceSet:
    """Shared services: an LLM server, an MLflow server and a shared incident inbox."""
    _require("production", "RVU_LLM_BASE_URL", "RVU_LLM_MODEL", "MLFLOW_TRACKING_URI", "RVU_INCIDENT_DIR")
    return {
        **local_resources(),
        "data_source": PublicDatasetSourceResource(),
        "llm": _openai_llm(EnvVar("RVU_LLM_MODEL")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=EnvVar("MLFLOW_TRACKING_URI")),
        "recovery": RecoveryResource(incident_dir=EnvVar("RVU_INCIDENT_DIR")),
    }


DEPLOYMENTS: dict[str, Callable[[], ResourceSet]] = {
    "local": local_resources,
    "offline_mirror": offline_mirror_resources,
    "production": production_resources,
}


def deployment_name() -> str:
    return env_value(DEPLOYMENT_ENV) or DEFAULT_DEPLOYMENT


def deployment_resources(name: str | None = None) -> ResourceSet:
    """The resource set of ``name`` (default: RVU_DEPLOYMENT, else local)."""
    chosen = name or deployment_name()
    if chosen not in DEPLOYMENTS:
        raise ConfigError(f"Unknown deployment {chosen!r}: use one of {', '.join(DEPLOYMENTS)} ({DEPLOYMENT_ENV}).")
    return DEPLOYMENTS[chosen]()
