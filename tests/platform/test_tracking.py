from __future__ import annotations

import pytest

from rvu_pipelines.tracking import MlflowTracker, numeric_metrics


def test_run_round_trips_in_a_temp_tracking_dir(tmp_path) -> None:
    tracker = MlflowTracker(
        f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="roundtrip", artifact_root=tmp_path / "art"
    )
    artifact = tmp_path / "table.md"
    artifact.write_text("| a |\n|---|\n| 1 |\n")
    with tracker.run("asset_x", tags={"dagster_run_id": "r-1", "asset_key": "asset_x"}, params={"seed": 0}) as run:
        run.log_metrics({"tokens_per_s": 41.5, "f1": 0.9})
        run.log_artifact(artifact)
    with pytest.raises(RuntimeError), tracker.run("asset_y") as failed:
        raise RuntimeError("boom")

    runs = {r.info.run_id: r for r in MlflowTracker(tracker.tracking_uri, "roundtrip").latest_runs()}
    done = runs[run.run_id]
    assert done.info.status == "FINISHED"
    assert done.data.metrics == {"tokens_per_s": 41.5, "f1": 0.9}
    assert done.data.params == {"seed": "0"}
    assert done.data.tags["dagster_run_id"] == "r-1" and done.data.tags["git_commit"]
    assert runs[failed.run_id].info.status == "FAILED"
    assert (tmp_path / "art" / "roundtrip").is_dir()


def test_each_domain_has_its_own_experiment(tmp_path, new_mlflow_store) -> None:
    """Without an explicit experiment, an asset's run lands in its domain's experiment (by asset group)."""
    from dagster import DagsterInstance, materialize

    from assets.recovery import e2_closure_reproduction
    from resources import MlflowTrackerResource
    from rvu_pipelines.tracking import DOMAIN_EXPERIMENTS, experiment_for

    assert experiment_for("attacks") == "rvu-attacks" and experiment_for("recovery_reproductions") == "rvu-recovery"
    assert experiment_for("datasets") == experiment_for("models") == "rvu-data-models"
    assert len(set(DOMAIN_EXPERIMENTS.values())) >= 8  # data/models, recovery, memory, detectors, attacks + new ones
    uri = new_mlflow_store(tmp_path / "mlflow.db")
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [e2_closure_reproduction],
            resources={"mlflow_tracker": MlflowTrackerResource(tracking_uri=uri)},
            instance=instance,
        )
    assert result.success
    tracker = MlflowTracker(uri)
    assert [e.name for e in tracker.project_experiments()] == ["rvu-recovery"]
    runs = tracker.latest_project_runs()
    assert len(runs) == 1 and runs[0].data.tags["asset_key"] == "e2_closure_reproduction"


def test_losing_the_race_to_create_the_experiment_uses_the_winners(tmp_path, monkeypatch, new_mlflow_store) -> None:
    """Steps starting together on a fresh store each look the experiment up, find none, and create it: all but
    one get RESOURCE_ALREADY_EXISTS from the store (seen with celery workers on the scale profile's MLflow server).
    Here the other process wins between our look-up and our create; the store's real error is handled."""
    from mlflow.tracking import MlflowClient

    uri = new_mlflow_store(tmp_path / "mlflow.db")
    winner = MlflowTracker(uri, experiment="raced", artifact_root=tmp_path / "art").experiment_id()
    lookup = MlflowClient.get_experiment_by_name
    calls = []

    def looked_up_before_the_winner_created_it(self, name):  # type: ignore[no-untyped-def]
        calls.append(name)
        return None if len(calls) == 1 else lookup(self, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", looked_up_before_the_winner_created_it)
    assert MlflowTracker(uri, experiment="raced", artifact_root=tmp_path / "art").experiment_id() == winner
    assert len(calls) == 2


def test_numeric_metrics_names_each_number_by_its_path_and_skips_the_rest() -> None:
    report = {
        "bipia/text": {"token_count_auroc": {"value": 0.61, "n": 40}, "switch": {"layer": 7, "statistic": "hfer"}},
        "kept": True,  # a flag is not a metric
        "rows": [{"auroc": 0.9}],  # a table goes out as an artifact
        "undefined": float("nan"),
        "MEMSAD (k=2)": 0.5,
    }
    assert numeric_metrics(report) == {
        "MEMSAD_k_2": 0.5,
        "bipia/text_switch_layer": 7.0,
        "bipia/text_token_count_auroc_n": 40.0,
        "bipia/text_token_count_auroc_value": 0.61,
    }
