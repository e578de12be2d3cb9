"""Materialize every asset in-process with real data and models; checks pass; MLflow holds the smoke runs."""

from __future__ import annotations

import polars as pl
from dagster import DagsterInstance, materialize

from assets.definitions import ALL_ASSETS
from assets.recovery import incident_recovery
from resources import LocalTableIOManager, MlflowTrackerResource
from resources.deployments import deployment_resources
from rvu_pipelines.tracking import MlflowTracker


def test_every_asset_materializes_with_passing_checks(tmp_path, new_mlflow_store) -> None:
    tracking_uri = new_mlflow_store(tmp_path / "mlflow.db")
    resources = deployment_resources("local") | {
        "io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets")),
        "mlflow_tracker": MlflowTrackerResource(tracking_uri=tracking_uri, experiment="materialize-test"),
    }
    with DagsterInstance.ephemeral() as instance:
        # incident partitions are exercised in tests/recovery/test_recovery_dagster.py, the detector
        # chain (quick config) in tests/detectors/test_detectors_assets.py, attack cells in
        # tests/agents/test_attack_assets.py (the full Table 1 is `make run`, minutes of inference), the
        # memory-poisoning studies (minutes of trigger search and adaptive rewriting) in
        # tests/memory_poisoning/test_poisoning_assets.py and at library level in tests/memory_poisoning/test_study.py,
        # the spectral sample (forward passes with attentions; goal checks at WARN) in tests/spectral/test_assets.py,
        # the adapter sample (LoRA training) in tests/adapters/test_adapter_assets.py; the full adapter study (the zoo,
        # all of WMDP) is make adapters
        skip = ("detector_", "attack_", "memory_poisoning_", "spectral_", "adapter_", "wmdp_")
        unpartitioned = [
            a for a in ALL_ASSETS if a is not incident_recovery and not a.key.to_user_string().startswith(skip)
        ]
        # the monitor's USER-channel check defaults to the production detector, trained in the detector tests;
        # here the regex check keeps the smoke run to the assets it names
        run_config = {"ops": {"memory_monitor_evaluation": {"config": {"content_check": "regex"}}}}
        result = materialize(unpartitioned, resources=resources, instance=instance, run_config=run_config)
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert len(checks) >= 18 and all(check.passed for check in checks), [c for c in checks if not c.passed]

    deepset = pl.read_parquet(tmp_path / "assets" / "deepset_prompt_injections.parquet")
    assert deepset.height == 662
    manifest = pl.read_parquet(tmp_path / "assets" / "model_manifest.parquet")
    assert manifest["role"].to_list() == ["embedder", "llm"] and manifest["pinned"].all()

    runs = MlflowTracker(tracking_uri, "materialize-test").latest_runs()
    smoke = [r for r in runs if r.data.tags.get("asset_key") == "llm_smoke"]
    assert len(smoke) == 1
    assert smoke[0].data.metrics["generation_tokens_per_s"] > 0 and smoke[0].data.metrics["prompt_tokens_per_s"] > 0
    assert smoke[0].data.tags["dagster_run_id"] == result.run_id
    assert smoke[0].data.params["temperature"] == "0.0"
