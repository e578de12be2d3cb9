"""`make spectral` is one Dagster job: the study, its controls and the inline defense's cost, each an asset over
the data set assets, with MLflow runs and the stamped reports `rvu report` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, DagsterInvalidConfigError, materialize, validate_run_config

from assets.datasets import dataset_assets
from assets.definitions import defs
from assets.spectral import spectral_controls, spectral_hfer_cost, spectral_study
from resources import LocalTableIOManager, MlflowTrackerResource
from resources.deployments import deployment_resources
from rvu_pipelines.tracking import MlflowTracker

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = ("tofu", "bipia", "injecagent", "deepset_prompt_injections")


def test_make_spectral_launches_the_job_with_a_valid_config() -> None:
    job = defs.resolve_job_def("spectral_study_job")
    selected = {key.to_user_string() for key in job.asset_layer.executable_asset_keys}
    assert {"spectral_study", "spectral_controls", "spectral_hfer_cost"} <= selected
    config = yaml.safe_load((REPO / "configs" / "runs" / "spectral.yaml").read_text())
    assert validate_run_config(job, config)
    assert "--job spectral_study_job" in (REPO / "Makefile").read_text()
    with pytest.raises(DagsterInvalidConfigError, match="groups"):
        validate_run_config(job, {"ops": {"spectral_controls": {"config": {"groups": "many"}}}})


@pytest.mark.slow  # the three studies at their smallest: forward passes, a calibration, the baselines
def test_the_three_studies_write_their_reports(tmp_path: Path, shared_data, new_mlflow_store) -> None:
    tracker = MlflowTracker(new_mlflow_store(tmp_path / "mlflow.db"), "spectral-study-test")
    resources = deployment_resources("local") | {
        "io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=tracker.tracking_uri, experiment="spectral-study-test"),
    }
    upstream = [a for a in dataset_assets() if a.key.to_user_string() in UPSTREAM]
    out = tmp_path / "spectral"
    run_config = {
        "ops": {
            "spectral_study": {
                "config": {
                    "sets": ["context_verification", "injecagent"],
                    "limit": 16,
                    "scopes": ["text"],
                    "draws": 2,
                    "comparison": False,
                    "out": str(out),
                }
            },
            "spectral_controls": {
                "config": {
                    "sets": ["bipia", "injecagent"],
                    "graphs": ["sink_free"],
                    "groups": 12,
                    "detectors": False,
                    "out": str(out / "controls"),
                }
            },
            "spectral_hfer_cost": {
                "config": {"suites": ["banking"], "per_source": 2, "policies": ["bayes"], "out": str(out)}
            },
        }
    }
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [*upstream, spectral_study, spectral_controls, spectral_hfer_cost],
            resources=resources,
            instance=instance,
            run_config=run_config,
        )
    assert result.success
    report = json.loads((out / "report.json").read_text())
    assert set(report) == {"context_verification/text", "injecagent/text"}
    assert all(entry["n_heldout"] > 0 for entry in report.values())
    assert "Measured" in (out / "controls" / "controls.md").read_text()
    assert "dg launch --assets spectral_hfer_cost --config-json" in (out / "hfer_cost.md").read_text()  # reruns it
    runs = tracker.latest_runs(max_results=5)
    assert len(runs) == 3 and any(run.data.metrics for run in runs)
