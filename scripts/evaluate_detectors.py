"""Materialize the detector assets (and the data sets they read) once and print seed 002's Tables 1-3.

Usage: ``.venv/bin/python scripts/evaluate_detectors.py [deepset] [jailbreak] [combined]`` (default: all
three), with the project's resources (RVU_HOME, MLFLOW_TRACKING_URI, RVU_DATA_MIRROR as for ``make run``).
The same through Dagster (runs recorded in the UI): ``make detectors`` (the ``detectors_job``).
"""

import os
import sys

from dagster import DagsterInstance, materialize

from assets.datasets import dataset_assets
from assets.detectors import detector_assets
from resources.deployments import deployment_resources
from rvu_pipelines.detectors.corpora import CORPUS_NAMES, SOURCE_DATASETS


def main(argv: list[str]) -> int:
    corpora = argv or list(CORPUS_NAMES)
    unknown = sorted(set(corpora) - set(CORPUS_NAMES))
    if unknown:
        print(f"Unknown corpora {unknown}. Allowed values: {', '.join(CORPUS_NAMES)}", file=sys.stderr)
        return 2
    datasets = {d for name in corpora for d in SOURCE_DATASETS[name]}
    selected = [a for a in dataset_assets() if a.key.to_user_string() in datasets]
    selected += [a for a in detector_assets() if a.key.path[-1].rsplit("_", 1)[-1] in corpora]
    instance = DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else DagsterInstance.ephemeral()
    with instance:
        result = materialize(selected, resources=deployment_resources(), instance=instance)
    for event in result.get_asset_materialization_events():
        metadata = event.materialization.metadata
        if "table" in metadata:
            print(f"\n## {event.asset_key.to_user_string()} (n_test={metadata['n_test'].value})\n")
            print(metadata["table"].value)
            print(f"\nROC: {metadata['roc_path'].value}  MLflow run: {metadata['mlflow_run_id'].value}")
    for check in result.get_asset_check_evaluations():
        print(f"check {check.asset_key.to_user_string()}:{check.check_name} passed={check.passed}")
    return 0 if result.success else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
