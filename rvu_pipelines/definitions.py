"""The Dagster code location: the one place that composes library, resources, assets and sensors.

Everything else in rvu_pipelines/ is plain Python; `dagster dev -w workspace.yaml` loads this module.
"""

from __future__ import annotations

from dagster import Definitions

from assets.attacks import attack_assets
from assets.datasets import dataset_assets
from assets.detectors import detector_assets
from assets.jobs import JOBS
from assets.memory import memory_assets
from assets.models import model_assets
from assets.recovery import recovery_assets
from resources import (
    DatasetSourceResource,
    EmbedderResource,
    LLMResource,
    LocalTableIOManager,
    MlflowTrackerResource,
    ModelStoreResource,
)
from resources.recovery import RecoveryResource
from rvu_pipelines.settings import env_value
from sensors import SCHEDULES, SENSORS

ALL_ASSETS = [
    *dataset_assets(),
    *model_assets(),
    *recovery_assets(),
    *memory_assets(),
    *detector_assets(),
    *attack_assets(),
]


def _resources() -> dict[str, object]:
    """Embedded defaults; each reads its scale-out choice from the environment (see README)."""
    return {
        "io_manager": LocalTableIOManager(),
        "data_source": DatasetSourceResource(),
        "model_store": ModelStoreResource(),
        "llm": LLMResource(
            backend=env_value("RVU_LLM_BACKEND") or "llama_cpp",  # type: ignore[arg-type]
            base_url=env_value("RVU_LLM_BASE_URL"),
            model=env_value("RVU_LLM_MODEL"),
        ),
        "embedder": EmbedderResource(),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=env_value("MLFLOW_TRACKING_URI")),
        "recovery": RecoveryResource(incident_dir=env_value("RVU_INCIDENT_DIR")),
    }


defs = Definitions(
    assets=ALL_ASSETS,
    jobs=JOBS,
    schedules=SCHEDULES,
    sensors=SENSORS,
    resources=_resources(),
)
