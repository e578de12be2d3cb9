"""The default job (`make run`), the one job that crosses every domain. Each domain's own jobs live beside its
assets (e.g. ``assets.spectral.spectral_jobs``) and ``assets.definitions`` composes them. Every job runs its steps
with ``assets.executors.JOB_EXECUTOR``: in-process by default (torch and transformers load once), a bounded
multiprocess executor in the scale profile."""

from dagster import AssetSelection, define_asset_job

from assets.executors import JOB_EXECUTOR
from assets.profiles import FULL_STUDY, NIGHTLY_ONLY, PROFILE_TAG

# The detectors a newcomer's MLflow registry should hold after `make run`: D2 and D4 trained on deepset, and the
# production detector the classifier defense, the monitor and recovery use by alias. The three-corpus study
# with its evaluations stays in detectors_job.
DEFAULT_DETECTORS = AssetSelection.assets(
    "detector_corpus_deepset",
    "detector_corpus_jailbreak",
    "detector_d2_deepset",
    "detector_d4_deepset",
    "detector_production",
)

default_profile_job = define_asset_job(
    "default_profile_job",
    # Everything that finishes in minutes. Incident partitions are recovered by recovery_job (sensor-started);
    # training and evaluating the five detectors on three corpora takes tens of minutes of CPU: detectors_job.
    # Full studies and partitioned cells carry the FULL_STUDY tag (their sampled siblings run here); the
    # benchmark samples carry NIGHTLY_ONLY.
    selection=(
        AssetSelection.all()
        - AssetSelection.groups("recovery", "detectors")
        - AssetSelection.tag(PROFILE_TAG, FULL_STUDY[PROFILE_TAG])
        - AssetSelection.tag(PROFILE_TAG, NIGHTLY_ONLY[PROFILE_TAG])
    )
    | DEFAULT_DETECTORS,
    executor_def=JOB_EXECUTOR,
    description="Materialize every asset of the default profile (data sets, models, smoke runs, "
    "reproductions, memory monitor evaluation, D2/D4 trained and registered on deepset, attack Table 1, the "
    "memory-poisoning, spectral and adapter samples) with checks; the benchmark samples run in the nightly sweep.",
)
