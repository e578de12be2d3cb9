"""A celery worker's step process killed mid-cell on the local scale profile: the run fails saying so, the daemon
retries it from the failed step, the cell resumes its episodes, and ASR/utility equal an uninterrupted embedded run.

Slow (the profile's services, two LLM runtimes, one cell three times): `make test-slow`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from rvu_pipelines.scale.postgres_server import free_port
from rvu_pipelines.scale.profile import Ports, ScaleProfile

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
DAGSTER = shutil.which("dagster") or str(BIN / "dagster")
CELL = "canonical|vanilla"
CONFIG = json.dumps({"ops": {"attack_cell": {"config": {"limit": 4}}}})
TAGS = json.dumps(
    {"dagster/partition": CELL, "dagster/partition/benchmark": "canonical", "dagster/partition/defense": "vanilla"}
)


def _dagster(args: list[str], env: dict[str, str], cwd: Path) -> None:
    done = subprocess.run([DAGSTER, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    assert done.returncode == 0, f"dagster {' '.join(args[:2])}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _cell_metrics(tracking_uri: str) -> list[dict[str, float]]:
    """ASR / utility of every finished MLflow run of the cell (a killed attempt never finishes)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return [
        {m: round(run.data.metrics[m], 6) for m in ("asr", "utility")}
        for run in runs
        if run.info.status == "FINISHED" and "asr" in run.data.metrics
    ]


def _embedded_reference(home: Path) -> list[dict[str, float]]:
    """The same cell on the embedded defaults: SQLite instance, in-process steps, llama.cpp in-process."""
    (home / "dagster_home").mkdir(parents=True)
    tracking = f"sqlite:///{home / 'mlflow.db'}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RVU_LLM_", "RVU_CELERY", "RVU_FAULT"))},
        "RVU_HOME": str(home / "state"),
        "DAGSTER_HOME": str(home / "dagster_home"),
        "MLFLOW_TRACKING_URI": tracking,
        "RVU_EXECUTOR": "in_process",
        "RVU_PROVENANCE_STORE": "",
    }
    _dagster(["asset", "materialize", "-m", "rvu_pipelines.definitions", "--select", "llm_model"], env, home)
    config = home / "config.json"  # `job execute` takes config files only (JSON is YAML)
    config.write_text(CONFIG)
    _dagster(
        ["job", "execute", "-m", "rvu_pipelines.definitions", "-j", "attack_cells_job", "--tags", TAGS]
        + ["--config", str(config)],
        env,
        home,
    )
    return _cell_metrics(tracking)


def _pool_processes(worker_pid: int) -> list:
    """The processes that execute celery tasks: children of the celery main process that `dagster-celery worker
    start` (the pid file's process) runs."""
    import psutil

    return [pool for main in psutil.Process(worker_pid).children() for pool in main.children()]


def _completions(log: Path) -> int:
    return log.read_text(errors="replace").count("POST /v1/chat/completions") if log.exists() else 0


@pytest.mark.slow
@pytest.mark.integration
def test_a_worker_killed_mid_cell_fails_the_run_clearly_and_the_retry_resumes_to_the_embedded_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not shutil.which("redis-server"):
        pytest.skip("the celery workers need Redis (apt install redis-server; `make scale-up` does it as root)")
    base = Path(tempfile.mkdtemp(prefix="rvu-scale-fault-"))
    base.chmod(0o711)  # PostgreSQL runs as its own account when we are root
    monkeypatch.setenv("RVU_HOME", str(base / "state"))  # the workers' state: an empty LLM response cache
    profile = ScaleProfile(base / "scale", Ports(*(free_port() for _ in range(5))), workers=1)
    try:
        _kill_mid_cell_and_check(profile, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _kill_mid_cell_and_check(profile: ScaleProfile, base: Path) -> None:
    from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus

    try:
        profile.up()
        env = {**os.environ, **profile.environment()}
        _dagster(
            ["asset", "materialize", "-m", "rvu_pipelines.definitions", "--select", "llm_model"],
            {**env, "RVU_EXECUTOR": "in_process"},
            base,
        )
        server_log = profile.root / "logs" / "llm-server-0.log"
        answered_before = _completions(server_log)
        _dagster(
            ["job", "launch", "-w", str(REPO / "workspace.yaml"), "-j", "attack_cells_job", "--tags", TAGS]
            + ["--config-json", CONFIG],
            env,
            base,
        )
        # mid-cell: the worker's step has had its first LLM answer and has episodes left
        deadline = time.monotonic() + 300
        while _completions(server_log) == answered_before:
            assert time.monotonic() < deadline, "the cell never reached the LLM server"
            time.sleep(0.1)
        worker_pid = next(s.pid for s in profile.status() if s.name == "celery-worker-0")
        assert worker_pid is not None
        killed = _pool_processes(worker_pid)
        assert killed, "no celery pool process found under the worker"
        for process in killed:
            os.kill(process.pid, signal.SIGKILL)

        instance = DagsterInstance.from_config(str(profile.dagster_home))
        deadline = time.monotonic() + 600
        while True:
            records = sorted(instance.get_run_records(), key=lambda record: record.create_timestamp)
            cell_runs = [r.dagster_run for r in records if r.dagster_run.job_name == "attack_cells_job"]
            done = [run for run in cell_runs if run.status == DagsterRunStatus.SUCCESS]
            if done or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert [run.status for run in cell_runs] == [DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS], (
            profile.root / "logs" / "dagster-daemon.log"
        ).read_text()[-3000:]
        first, retry = cell_runs
        assert retry.parent_run_id == first.run_id and retry.tags.get("dagster/retry_number") == "1"
        # the failed run says what happened: the worker's process was lost, by signal
        messages = " ".join(
            str(record.dagster_event.event_specific_data)
            for record in instance.all_logs(first.run_id, of_type=DagsterEventType.RUN_FAILURE)
            if record.dagster_event is not None
        )
        assert "WorkerLostError" in messages and "SIGKILL" in messages, messages[:2000]
        scaled = _cell_metrics(profile.mlflow_url)
    finally:
        profile.down()
    reference = _embedded_reference(base / "embedded")
    assert len(reference) == 1 and scaled == reference  # one finished run, the uninterrupted result
