"""The Dagster code location: the one place that composes library, resources, assets and sensors.

Everything else in rvu_pipelines/ is plain Python; `dagster dev -w workspace.yaml` loads this module.
"""

from __future__ import annotations

from dagster import AssetSelection, Definitions, define_asset_job, in_process_executor

from assets.attacks import attack_assets, attack_cell, cell_partitions
from assets.datasets import dataset_assets
from assets.detectors import detector_assets
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
from sensors import JOBS, SCHEDULES, SENSORS

ALL_ASSETS = [*dataset_assets(), *model_assets(), *recovery_assets(), *memory_assets(), *detector_assets(),
              *attack_assets()]

# The detectors a newcomer's MLflow registry should hold after `make run`: D2 and D4 trained on deepset
# (about a minute together). The three-corpus study with its evaluations stays in detectors_job.
DEFAULT_DETECTORS = AssetSelection.assets("detector_corpus_deepset", "detector_d2_deepset", "detector_d4_deepset")

# In-process: the steps share one interpreter, so torch/transformers are imported once, not per step.
default_profile_job = define_asset_job(
    "default_profile_job",
    # Everything that finishes in minutes. Incident partitions are recovered by recovery_job (sensor-started);
    # training and evaluating the five detectors on three corpora takes ~30 min on 2 cores: detectors_job.
    # attack_cell is partitioned (benchmark × defense): backfills and the UI; the default job runs its
    # unpartitioned siblings (Table 1 and the benchmark samples).
    selection=(AssetSelection.all() - AssetSelection.groups("recovery", "detectors") - AssetSelection.assets(attack_cell))
    | DEFAULT_DETECTORS,
    executor_def=in_process_executor,
    description="Materialize every asset of the default profile (data sets, models, smoke runs, "
    "reproductions, memory monitor evaluation, D2/D4 trained and registered on deepset, attack Table 1 and "
    "benchmark samples) with checks.",
)

attack_cells_job = define_asset_job(
    "attack_cells_job",
    selection=AssetSelection.assets(attack_cell),
    partitions_def=cell_partitions,
    executor_def=in_process_executor,
    description="Attack-table cells (benchmark × defense partitions): launch or backfill any cell from the UI; "
    "config `limit` sets the sample size (null = the whole benchmark).",
)

detectors_job = define_asset_job(
    "detectors_job",
    selection=AssetSelection.groups("detectors").upstream(),
    executor_def=in_process_executor,
    description="Seed 002 §5-6: build the three corpora, train and register D2/D4 per corpus in MLflow, and "
    "evaluate D1-D5 with bootstrap CIs (~30 min on 2 cores; `make detectors`).",
)


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
    jobs=[default_profile_job, detectors_job, attack_cells_job, *JOBS],
    schedules=SCHEDULES,
    sensors=SENSORS,
    resources=_resources(),
)
