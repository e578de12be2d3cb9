"""The Dagster code location: the one place that composes resources, every domain's assets and jobs (each domain
module holds its assets, checks, partitions and jobs together), the default job, sensors and schedules.

It lives in the Dagster layer, beside the assets; the library (rvu_pipelines/) is plain Python and never imports
Dagster. `dagster dev -w workspace.yaml` loads this module.
"""

from __future__ import annotations

from dagster import Definitions

from assets.adapter_study import adapter_study_assets, adapter_study_jobs
from assets.adapters import adapter_assets, adapter_jobs
from assets.attack_study import attack_study_assets, attack_study_jobs
from assets.attacks import attack_assets, attack_jobs
from assets.datasets import dataset_assets
from assets.detectors import detector_assets, detector_jobs
from assets.jobs import default_profile_job
from assets.memory import memory_assets
from assets.memory_poisoning import memory_poisoning_assets, memory_poisoning_jobs
from assets.models import model_assets
from assets.recovery import recovery_assets, recovery_jobs
from assets.spectral import spectral_assets, spectral_jobs
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


JOBS = [
    default_profile_job,
    *recovery_jobs(),
    *attack_jobs(),
    *attack_study_jobs(),
    *detector_jobs(),
    *memory_poisoning_jobs(),
    *spectral_jobs(),
    *adapter_jobs(),
    *adapter_study_jobs(),
]

defs = Definitions(
    assets=ALL_ASSETS,
    jobs=JOBS,
    schedules=SCHEDULES,
    sensors=SENSORS,
    resources=deployment_resources(),  # RVU_DEPLOYMENT: local (default), offline_mirror or production
)
