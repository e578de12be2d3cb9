"""The scale profile's Dagster side: a job run on a PostgreSQL-backed instance (runs, event log) with the bounded
multiprocess executor, as `dagster job execute` runs it — real server, real subprocess steps."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from rvu_pipelines.scale.dagster_instance import dagster_postgres_url, instance_config, write_instance

REPO = Path(__file__).resolve().parents[2]
DAGSTER = shutil.which("dagster") or str(REPO / ".venv" / "bin" / "dagster")


def test_instance_config_is_postgres_with_queued_runs() -> None:
    config = instance_config("postgresql://rvu@db:5432/dagster", max_concurrent_runs=3)
    assert config["storage"] == {"postgres": {"postgres_url": "postgresql+psycopg2://rvu@db:5432/dagster"}}
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert config["run_coordinator"]["config"]["max_concurrent_runs"] == 3


def test_a_job_runs_multiprocess_on_a_postgres_instance(postgres_server, tmp_path: Path, new_mlflow_store) -> None:
    import psycopg
    from dagster import DagsterInstance

    url = postgres_server.create_database("dagster_scale_test")
    home = tmp_path / "dagster_home"
    write_instance(home, url)
    assert yaml.safe_load((home / "dagster.yaml").read_text())["storage"]["postgres"]["postgres_url"].endswith(
        url.split("://", 1)[1]
    )
    # MLflow on PostgreSQL too, its schema created once up front (as an MLflow server does at start): two step
    # processes migrating a fresh store at once is a race on any backend, and SQLite's file locks are the problem
    # the scale profile exists to remove
    tracking = dagster_postgres_url(postgres_server.create_database("mlflow_scale_test"))
    import mlflow

    mlflow.MlflowClient(tracking).search_experiments()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "RVU_EXECUTOR": "multiprocess",
        "RVU_MAX_CONCURRENT": "2",
        "MLFLOW_TRACKING_URI": tracking,
    }
    done = subprocess.run(
        [DAGSTER, "job", "execute", "-m", "assets.definitions", "-j", "recovery_reproductions_job"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,  # MLflow's default artifact root is relative to the working folder
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with psycopg.connect(url) as connection:  # the run and its events are in PostgreSQL, not in a SQLite file
        statuses = connection.execute("SELECT status FROM runs").fetchall()
        kinds = dict(
            connection.execute(
                "SELECT dagster_event_type, count(*) FROM event_logs WHERE dagster_event_type IS NOT NULL "
                "GROUP BY dagster_event_type"
            ).fetchall()
        )
    assert statuses == [("SUCCESS",)]
    assert kinds.get("STEP_SUCCESS") == 3 and kinds.get("STEP_WORKER_STARTED") == 3, kinds  # one process per step
    assert not list(home.rglob("*.db")), "no SQLite run or event storage beside the PostgreSQL one"
    os.environ["DAGSTER_HOME"], previous = str(home), os.environ.get("DAGSTER_HOME")
    try:
        with DagsterInstance.get() as instance:
            assert len(instance.get_runs()) == 1
    finally:
        if previous is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = previous
    # the same job embedded (SQLite instance and MLflow, in-process executor) gives the same numbers
    embedded_home, embedded_tracking = tmp_path / "embedded_home", new_mlflow_store(tmp_path / "embedded_mlflow.db")
    embedded_home.mkdir()
    embedded = subprocess.run(
        [DAGSTER, "job", "execute", "-m", "assets.definitions", "-j", "recovery_reproductions_job"],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **env,
            "DAGSTER_HOME": str(embedded_home),
            "RVU_EXECUTOR": "in_process",
            "MLFLOW_TRACKING_URI": embedded_tracking,
        },
        cwd=tmp_path,
    )
    assert embedded.returncode == 0, embedded.stdout[-3000:] + embedded.stderr[-3000:]
    assert _run_metrics(tracking) == _run_metrics(embedded_tracking) != {}


def _run_metrics(tracking_uri: str) -> dict[str, dict[str, float]]:
    """Every MLflow run's metrics by run name (the reproductions name their runs)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return {run.info.run_name: dict(run.data.metrics) for run in client.search_runs(experiments)}


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_concurrency_is_refused_by_name(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from assets.executors import job_executor
    from rvu_pipelines.errors import ConfigError

    monkeypatch.setenv("RVU_EXECUTOR", "multiprocess")
    monkeypatch.setenv("RVU_MAX_CONCURRENT", value)
    with pytest.raises(ConfigError, match="RVU_MAX_CONCURRENT"):
        job_executor()
