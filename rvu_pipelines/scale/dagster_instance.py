"""The Dagster instance of the scale profile: runs, event log and schedules in PostgreSQL, a queued run coordinator.

SQLite's event log locks under parallel steps (dagster issue 2884; the maintainers' answer is Postgres). This
writes the ``dagster.yaml`` a DAGSTER_HOME needs for that; plain data, no Dagster import (the library never
imports Dagster), and the same limits the embedded instance has (one recovery run per provenance store at a time).

A failed run is retried once by the daemon, from the failed step on (Dagster's run retries): a celery worker or
step process killed mid-cell (the OOM killer, a node drained) costs the lost step, not the sweep. Cells and
recoveries are deterministic and idempotent (same ASR, byte-identical certificates on re-run), so the retry gives
the uninterrupted result; a deterministic failure fails twice and stays failed. A run that hangs instead (a
celery worker killed whole leaves its task unacknowledged, and the run waits for a result that never comes) is
failed by the daemon's run monitoring after ``MAX_RUNTIME_S`` (6 h; a run's ``dagster/max_runtime`` tag overrides).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rvu_pipelines.atomic_write import write_atomically


def dagster_postgres_url(postgres_url: str) -> str:
    """The URL with psycopg2 named as the driver. dagster-postgres is written against psycopg2, while SQLAlchemy
    2.1 maps a bare ``postgresql://`` to psycopg 3, with which its ``NOTIFY run_events, $1`` is a syntax error."""
    scheme, sep, rest = postgres_url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: {postgres_url!r}")
    return f"postgresql+psycopg2://{rest}"


RUN_RETRIES = {"enabled": True, "max_retries": 1, "retry_on_asset_or_op_failure": True}
MAX_RUNTIME_S = 6 * 3600  # longer than any nightly cell or study step on a small CPU machine
RUN_MONITORING = {"enabled": True, "max_runtime_seconds": MAX_RUNTIME_S, "poll_interval_seconds": 60}


def instance_config(postgres_url: str, *, max_concurrent_runs: int = 4) -> dict[str, Any]:
    """dagster.yaml as a dict: ``dagster-postgres`` storage at ``postgres_url`` (a libpq URL), queued runs."""
    return {
        "run_retries": dict(RUN_RETRIES),
        "run_monitoring": dict(RUN_MONITORING),
        "telemetry": {"enabled": False},
        "storage": {"postgres": {"postgres_url": dagster_postgres_url(postgres_url)}},
        "run_coordinator": {
            "module": "dagster.core.run_coordinator",
            "class": "QueuedRunCoordinator",
            "config": {
                "max_concurrent_runs": max_concurrent_runs,
                "tag_concurrency_limits": [{"key": "rvu/provenance_store", "limit": 1}],
            },
        },
    }


def write_instance(dagster_home: Path, postgres_url: str, *, max_concurrent_runs: int = 4) -> Path:
    """Write ``dagster_home/dagster.yaml`` (replacing one that is there) and return its path."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    target = dagster_home / "dagster.yaml"
    config = instance_config(postgres_url, max_concurrent_runs=max_concurrent_runs)
    return write_atomically(target, yaml.safe_dump(config, sort_keys=True))
