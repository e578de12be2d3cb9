"""The recovery layer in Dagster: the sensor's triage and run keys, and one incident recovered as a partition."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dagster import DagsterInstance, build_sensor_context, materialize

from assets.recovery import incident_partitions, incident_recovery
from resources import LocalTableIOManager, MlflowTrackerResource
from resources.deployments import deployment_resources
from resources.recovery import RecoveryResource
from rvu_pipelines.tracking import MlflowTracker
from sensors.incidents import incident_log_sensor

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"


def test_sensor_requests_one_run_per_content_and_dead_letters_bad_files(tmp_path) -> None:
    recovery = RecoveryResource(root=str(tmp_path / "state"), incident_dir=str(tmp_path / "incidents"))
    inbox = recovery.folders().inbox
    shutil.copy(EXAMPLES / "incident_example.jsonl", inbox / "a.jsonl")
    shutil.copy(EXAMPLES / "incident_example.jsonl", inbox / "same-content.jsonl")
    shutil.copy(EXAMPLES / "incident_malformed.jsonl", inbox / "bad.jsonl")
    with DagsterInstance.ephemeral() as instance:
        result = incident_log_sensor(build_sensor_context(instance=instance, resources={"recovery": recovery}))
    assert len({request.run_key for request in result.run_requests}) == 1
    [request] = result.run_requests
    assert request.partition_key.startswith("inc-") and len(request.run_key) == 64
    assert result.dynamic_partitions_requests[0].partition_keys == [request.partition_key]
    dead = recovery.folders().dead_letter
    report = json.loads((dead / "bad.jsonl.error.json").read_text())
    assert (dead / "bad.jsonl").is_file() and report["problems"][0]["line"] >= 1 and report["problems"][0]["field"]
    assert list(inbox.iterdir()) == []


def test_incident_partition_recovers_with_passing_checks(tmp_path, new_mlflow_store) -> None:
    recovery = RecoveryResource(root=str(tmp_path / "state"), incident_dir=str(tmp_path / "incidents"))
    shutil.copy(EXAMPLES / "incident_example.jsonl", recovery.folders().inbox / "incident.jsonl")
    tracking = new_mlflow_store(tmp_path / "mlflow.db")
    with DagsterInstance.ephemeral() as instance:
        sensed = incident_log_sensor(build_sensor_context(instance=instance, resources={"recovery": recovery}))
        partition = sensed.run_requests[0].partition_key
        instance.add_dynamic_partitions(incident_partitions.name, [partition])
        resources = deployment_resources("local") | {
            "recovery": recovery,
            "io_manager": LocalTableIOManager(base_dir=str(tmp_path / "assets")),
            "mlflow_tracker": MlflowTrackerResource(tracking_uri=tracking, experiment="recovery-test"),
        }
        result = materialize([incident_recovery], partition_key=partition, resources=resources, instance=instance)
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert sorted(c.check_name for c in checks) == ["corollary_3_1", "signature_verifies", "v2_contains_v1"]
    assert all(c.passed for c in checks)
    assert recovery.certificate_path(partition).is_file()
    [run] = MlflowTracker(tracking, "recovery-test").latest_runs()
    assert run.data.tags["partition"] == partition
    assert run.data.metrics["closure_v2_size"] >= run.data.metrics["closure_v1_size"] > 0
