"""The Dagster code location: the one place that composes resources, assets, jobs and sensors.

It lives in the Dagster layer, beside the assets; the library (rvu_pipelines/) is plain Python and never imports
Dagster. `dagster dev -w workspace.yaml` loads this module.
"""

from __future__ import annotations

from dagster import Definitions

from assets.adapter_study import adapter_study_assets
from assets.adapters import adapter_assets
from assets.attack_study import attack_study_assets
from assets.attacks import attack_assets
from assets.datasets import dataset_assets
from assets.detectors import detector_assets
from assets.jobs import JOBS
from assets.memory import memory_assets
from assets.memory_poisoning import memory_poisoning_assets
from assets.models import model_assets
from assets.recovery import recovery_assets
from assets.spectral import spectral_assets
from resources.deployments import deployment_resources
from sensors import SCHEDULES, SENSORS

ALL_ASSETS = [
    *dataset_assets(),
    *model_assets(),
    *recovery_assets(),
    *memory_assets(),
    *memory_poisoning_assets(),
    *detector_assets(),
    *attack_assets(),
    *attack_study_assets(),
    *spectral_assets(),
    *adapter_assets(),
    *adapter_study_assets(),
]


defs = Definitions(
    assets=ALL_ASSETS,
    jobs=JOBS,
    schedules=SCHEDULES,
    sensors=SENSORS,
    resources=deployment_resources(),  # RVU_DEPLOYMENT: local (default), offline_mirror or production
)
