"""The sampled spectral asset materialized in-process on real data and the packaged LLM (8 examples a set)."""

from __future__ import annotations

import pytest
from dagster import AssetCheckSeverity, DagsterInstance, materialize

from assets.datasets import dataset_assets
from assets.models import model_assets
from assets.spectral import spectral_assets
from resources import LocalTableIOManager, MlflowTrackerResource
from resources.deployments import deployment_resources
from rvu_pipelines.tracking import MlflowTracker

EXPERIMENT = "spectral-assets-test"


@pytest.mark.slow  # 16 full forward passes + the data and model assets: minutes on a loaded 2-core machine
def test_spectral_sample_materializes_with_checks_and_mlflow(tmp_path, spectral_model) -> None:
    tracker = MlflowTracker(experiment=EXPERIMENT)
    resources = deployment_resources("local") | {
        "io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=tracker.tracking_uri, experiment=EXPERIMENT),
    }
    wanted = {"tofu", "injecagent", "llm_model"}
    selected = [a for a in [*dataset_assets(), *model_assets()] if a.key.to_user_string() in wanted]
    selected += spectral_assets()
    run_config = {"ops": {"spectral_kill_switch_sample": {"config": {"per_set": 8}}}}
    with DagsterInstance.ephemeral() as instance:
        result = materialize(selected, resources=resources, instance=instance, run_config=run_config)
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["heldout_auroc_reported"].passed
    assert checks["context_verification_auroc_goal"].severity == AssetCheckSeverity.WARN
    assert checks["statistic_latency_goal"].metadata["ms_per_layer"].value > 0
    report = result.output_for_node("spectral_kill_switch_sample")
    assert set(report) == {"context_verification", "injecagent"}
    for entry in report.values():
        assert entry["n_calibration"] == 4 and entry["n_heldout"] == 4
        assert len(entry["hfer_by_layer"]) == 30
    runs = tracker.latest_runs(max_results=5)
    assert any("context_verification_auroc" in run.data.metrics for run in runs)
