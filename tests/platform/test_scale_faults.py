"""A celery worker killed mid-cell on the local scale profile, and the sweep still ends with the embedded result.

- its pool process (what the OOM killer picks): the run fails saying so, the daemon retries it from the failed step;
- the whole worker: the run hangs on a task nobody will finish until run monitoring fails it (a short
  ``dagster/max_runtime`` here, 6 h by default), `rvu scale up` restarts the worker, and the retry runs on it.
Either way ASR/utility and every episode's certificate body (its manifest digest) equal an uninterrupted embedded
run of the same cell.

Slow (the profile's services, two LLM runtimes, one cell several times): `make test-slow`.
"""

from __future__ import annotations

import contextlib
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
from rvu_pipelines.scale.profile import Ports, ScaleProfile, embedded_environment

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
DAGSTER = shutil.which("dagster") or str(BIN / "dagster")
CELL = "native.rvu_v2|canonical"  # the defense that recovers each episode and signs a certificate
# the cell is rvu_v2's, which no classifier reads: the heuristic detector keeps the run from needing a trained one
CONFIG = json.dumps({"ops": {"attack_cell": {"config": {"limit": 4, "detector": "heuristic"}}}})
TAGS = json.dumps(
    {"dagster/partition": CELL, "dagster/partition/arm": "native.rvu_v2", "dagster/partition/benchmark": "canonical"}
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


def _certificate_digests(state: Path) -> dict[str, str]:
    """Per episode, the manifest digest of its recovery certificate: the sha256 of everything signed except the
    signature (each state folder signs with its own key, so whole files differ by construction)."""
    certificates = sorted((state / "attacks" / "episodes").rglob("certificate.json"))
    return {
        str(path.parent.relative_to(state)): json.loads(path.read_text())["manifest_digest"] for path in certificates
    }


def _embedded_reference(home: Path) -> tuple[list[dict[str, float]], dict[str, str]]:
    """The same cell on the embedded defaults: SQLite instance, in-process steps, llama.cpp in-process."""
    (home / "dagster_home").mkdir(parents=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RVU_LLM_", "RVU_CELERY", "RVU_FAULT"))}
    env = embedded_environment(home, base)
    _dagster(["asset", "materialize", "-m", "assets.definitions", "--select", "llm_model"], env, home)
    config = home / "config.json"  # `job execute` takes config files only (JSON is YAML)
    config.write_text(CONFIG)
    _dagster(
        ["job", "execute", "-m", "assets.definitions", "-j", "attack_cells_job", "--tags", TAGS]
        + ["--config", str(config)],
        env,
        home,
    )
    return _cell_metrics(env["MLFLOW_TRACKING_URI"]), _certificate_digests(home / "state")


def _pool_processes(worker_pid: int) -> list:
    """The processes that execute celery tasks: children of the celery main process that `dagster-celery worker
    start` (the pid file's process) runs."""
    import psutil

    return [pool for main in psutil.Process(worker_pid).children() for pool in main.children()]


def _worker_group(worker_pid: int) -> list[int]:
    """Every process of the worker: `dagster-celery worker start`, the celery main process, its pool."""
    import psutil

    root = psutil.Process(worker_pid)
    return [root.pid, *(child.pid for child in root.children(recursive=True))]


def _completions(log: Path) -> int:
    return log.read_text(errors="replace").count("POST /v1/chat/completions") if log.exists() else 0


@pytest.fixture(scope="module")
def embedded_reference(tmp_path_factory) -> tuple[list[dict[str, float]], dict[str, str]]:
    metrics, digests = _embedded_reference(tmp_path_factory.mktemp("embedded"))
    assert len(metrics) == 1 and len(digests) == 4  # one finished run; one certificate per scenario
    return metrics, digests


@pytest.fixture
def profile_home(monkeypatch: pytest.MonkeyPatch):
    if not shutil.which("redis-server"):
        pytest.skip("the celery workers need Redis (apt install redis-server; `make scale-up` does it as root)")
    base = Path(tempfile.mkdtemp(prefix="rvu-scale-fault-"))
    base.chmod(0o711)  # PostgreSQL runs as its own account when we are root
    monkeypatch.setenv("RVU_HOME", str(base / "state"))  # the workers' state: an empty LLM response cache
    profile = ScaleProfile(base / "scale", Ports(*(free_port() for _ in range(5))), workers=1)
    try:
        yield profile, base
    finally:
        profile.down()
        shutil.rmtree(base, ignore_errors=True)


def _launch_cell_and_wait_for_the_llm(profile: ScaleProfile, base: Path, tags: dict[str, str]) -> None:
    """Bring the profile up, launch the cell through the daemon, return once the worker's step had its first
    LLM answer (it has episodes left: mid-cell)."""
    profile.up()
    env = {**os.environ, **profile.environment()}
    _dagster(
        ["asset", "materialize", "-m", "assets.definitions", "--select", "llm_model"],
        {**env, "RVU_EXECUTOR": "in_process"},
        base,
    )
    server_log = profile.root / "logs" / "llm-server-0.log"
    answered_before = _completions(server_log)
    _dagster(
        ["job", "launch", "-w", str(REPO / "workspace.yaml"), "-j", "attack_cells_job"]
        + ["--tags", json.dumps({**json.loads(TAGS), **tags}), "--config-json", CONFIG],
        env,
        base,
    )
    deadline = time.monotonic() + 300
    while _completions(server_log) == answered_before:
        assert time.monotonic() < deadline, "the cell never reached the LLM server"
        time.sleep(0.1)


def _cell_runs_once_one_succeeded(profile: ScaleProfile, timeout_s: float) -> list:
    from dagster import DagsterInstance, DagsterRunStatus

    instance = DagsterInstance.from_config(str(profile.dagster_home))
    deadline = time.monotonic() + timeout_s
    while True:
        records = sorted(instance.get_run_records(), key=lambda record: record.create_timestamp)
        runs = [r.dagster_run for r in records if r.dagster_run.job_name == "attack_cells_job"]
        if any(run.status == DagsterRunStatus.SUCCESS for run in runs) or time.monotonic() > deadline:
            return runs
        time.sleep(2)


def _failure_message(profile: ScaleProfile, run_id: str) -> str:
    from dagster import DagsterEventType, DagsterInstance

    instance = DagsterInstance.from_config(str(profile.dagster_home))
    return " ".join(
        f"{record.message} {record.dagster_event.event_specific_data}"
        for record in instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)
        if record.dagster_event is not None
    )


def _assert_failed_then_retried(profile: ScaleProfile, runs: list) -> tuple:
    from dagster import DagsterRunStatus

    daemon_log = (profile.root / "logs" / "dagster-daemon.log").read_text()[-3000:]
    assert [run.status for run in runs] == [DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS], daemon_log
    first, retry = runs
    assert retry.parent_run_id == first.run_id and retry.tags.get("dagster/retry_number") == "1"
    return first, retry


@pytest.mark.slow
@pytest.mark.integration
def test_a_killed_pool_process_fails_the_run_clearly_and_the_retry_gives_the_embedded_result(
    profile_home, embedded_reference
) -> None:
    profile, base = profile_home
    _launch_cell_and_wait_for_the_llm(profile, base, {})
    worker_pid = next(s.pid for s in profile.status() if s.name == "celery-worker-0")
    assert worker_pid is not None
    killed = _pool_processes(worker_pid)
    assert killed, "no celery pool process found under the worker"
    for process in killed:
        os.kill(process.pid, signal.SIGKILL)
    first, _ = _assert_failed_then_retried(profile, _cell_runs_once_one_succeeded(profile, 600))
    message = _failure_message(profile, first.run_id)  # the worker's process was lost, by signal
    assert "WorkerLostError" in message and "SIGKILL" in message, message[:2000]
    metrics, digests = embedded_reference
    assert _cell_metrics(profile.mlflow_url) == metrics  # one finished run, the uninterrupted result
    assert _certificate_digests(base / "state") == digests  # every episode's certificate signs the same body


@pytest.mark.slow
@pytest.mark.integration
def test_a_worker_killed_whole_hangs_its_run_until_monitoring_fails_it_and_the_retry_runs_on_the_restarted_worker(
    profile_home, embedded_reference
) -> None:
    profile, base = profile_home
    _launch_cell_and_wait_for_the_llm(profile, base, {"dagster/max_runtime": "150"})
    worker_pid = next(s.pid for s in profile.status() if s.name == "celery-worker-0")
    assert worker_pid is not None
    for pid in _worker_group(worker_pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 15  # SIGKILL is delivered asynchronously: give the kernel a moment
    while next(s for s in profile.status() if s.name == "celery-worker-0").running:
        assert time.monotonic() < deadline, "`rvu scale status` still shows the killed worker running"
        time.sleep(0.2)
    profile.up()  # idempotent: restarts only the dead worker
    first, _ = _assert_failed_then_retried(profile, _cell_runs_once_one_succeeded(profile, 900))
    message = _failure_message(profile, first.run_id)
    assert "maximum runtime" in message, message[:2000]
    metrics, digests = embedded_reference
    assert _cell_metrics(profile.mlflow_url) == metrics
    assert _certificate_digests(base / "state") == digests
