"""`rvu scale up / status / down`: the local scale profile's real services on loopback, and a run through them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from rvu_pipelines.cli_scale import configured_ports
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scale.postgres_server import free_port
from rvu_pipelines.scale.profile import PROFILE_VARIABLES, Ports, ScaleProfile, embedded_environment

REPO = Path(__file__).resolve().parents[2]
DAGSTER = shutil.which("dagster") or str(REPO / ".venv" / "bin" / "dagster")


def test_ports_come_from_settings_and_a_bad_one_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RVU_SCALE_POSTGRES_PORT", raising=False)
    monkeypatch.delenv("RVU_SCALE_DAGSTER_PORT", raising=False)
    monkeypatch.setenv("RVU_SCALE_MLFLOW_PORT", "15999")
    monkeypatch.delenv("RVU_SCALE_REDIS_PORT", raising=False)
    monkeypatch.setenv("RVU_SCALE_LLM_PORT", "18090")
    assert configured_ports() == Ports(5433, 15999, 3001, 6380, 18090)
    monkeypatch.setenv("RVU_SCALE_DAGSTER_PORT", "80")
    with pytest.raises(ConfigError, match="RVU_SCALE_DAGSTER_PORT"):
        configured_ports()


def test_the_profile_environment_points_everything_at_its_services(tmp_path: Path) -> None:
    profile = ScaleProfile(tmp_path / "scale", Ports(15433, 15001, 13001, 16380, 18090), workers=2)
    env = profile.environment()
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:15001"
    assert env["RVU_PROVENANCE_STORE"] == "postgresql://rvu@127.0.0.1:15433/rvu?schema=rvu"
    assert env["DAGSTER_HOME"] == str(tmp_path / "scale" / "dagster_home") and env["RVU_EXECUTOR"] == "celery"
    assert env["RVU_CELERY_BROKER"] == "redis://127.0.0.1:16380/0"
    # LLM inference over HTTP, plain greedy like the in-process backend; worker i gets server i (18090 + i)
    assert env["RVU_LLM_BACKEND"] == "openai_compatible" and env["RVU_LLM_BASE_URL"] == "http://127.0.0.1:18090/v1"
    assert json.loads(env["RVU_LLM_EXTRA_BODY"]) == {"repeat_penalty": 1.0}
    states = {state.name: state for state in profile.status()}
    assert states["llm-server-1"].address == "http://127.0.0.1:18091/v1"
    assert [state.name for state in profile.status()][-5:] == [
        "llm-server-0",
        "llm-server-1",
        "redis",
        "celery-worker-0",
        "celery-worker-1",
    ]
    assert [state.running for state in profile.status()] == [False] * 9
    without = ScaleProfile(tmp_path / "scale", Ports(15433, 15001, 13001, 16380), workers=0)
    assert without.environment()["RVU_EXECUTOR"] == "multiprocess" and len(without.status()) == 5  # one server
    # the embedded reference drops everything the profile sets (so it cannot drift from environment())
    assert set(env) == set(PROFILE_VARIABLES)
    embedded = embedded_environment(tmp_path / "e", {**env, "PATH": "/bin"})
    assert embedded["MLFLOW_TRACKING_URI"].startswith("sqlite:///") and embedded["RVU_EXECUTOR"] == "in_process"
    assert embedded["PATH"] == "/bin" and not {"RVU_LLM_BACKEND", "RVU_PROVENANCE_STORE"} & set(embedded)
    in_process = ScaleProfile(tmp_path / "scale", workers=0, llm_servers=False)
    assert "RVU_LLM_BACKEND" not in in_process.environment() and len(in_process.status()) == 4


def test_the_profile_env_file_survives_a_shell(tmp_path: Path) -> None:
    """scale.env quotes its values: the JSON of RVU_LLM_EXTRA_BODY reaches a shell that sources it intact."""
    profile = ScaleProfile(tmp_path / "scale", Ports(15433, 15001, 13001, 16380, 18090), workers=1)
    profile.root.mkdir(parents=True)
    profile.write_env_file()
    shown = subprocess.run(
        ["bash", "-c", f'source {profile.env_file} && printf %s "$RVU_LLM_EXTRA_BODY"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(shown.stdout) == {"repeat_penalty": 1.0}


@pytest.mark.slow
@pytest.mark.integration
def test_scale_up_runs_a_queued_job_through_the_daemon_on_celery_and_scale_down_stops_everything(
    tmp_path: Path,
) -> None:
    import tempfile

    import psycopg

    root = Path(tempfile.mkdtemp(prefix="rvu-scale-")) / "scale"  # pytest's tmp is 0700: the server's account
    root.parent.chmod(0o711)  # (PostgreSQL refuses root) must be able to reach its data folder
    workers = 2 if shutil.which("redis-server") else 0  # celery needs the OS's Redis; without it: multiprocess
    profile = ScaleProfile(root, Ports(free_port(), free_port(), free_port(), free_port()), workers=workers)
    try:
        states = profile.up()
        assert all(state.running for state in states), states
        pids = [state.pid for state in states]
        assert [state.pid for state in profile.up()] == pids  # idempotent: nothing restarted
        env = {**os.environ, **profile.environment()}
        launched = subprocess.run(
            [DAGSTER, "job", "launch", "-w", str(REPO / "workspace.yaml"), "-j", "recovery_reproductions_job"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=tmp_path,
        )
        assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-2000:]
        deadline, status = time.monotonic() + 400, None
        while time.monotonic() < deadline and status not in ("SUCCESS", "FAILURE", "CANCELED"):
            time.sleep(3)
            with psycopg.connect(profile.database_url("dagster")) as connection:
                row = connection.execute("SELECT status FROM runs").fetchone()
            status = row[0] if row else None
        assert status == "SUCCESS", (profile.root / "logs" / "dagster-daemon.log").read_text()[-3000:]
        with psycopg.connect(profile.database_url("mlflow")) as connection:  # the MLflow server stored the runs
            assert connection.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
        if workers:  # the steps ran as celery tasks in the workers
            logs = "".join((root / "logs" / f"celery-worker-{i}.log").read_text() for i in range(workers))
            assert logs.count("succeeded") == 3, logs[-3000:]
    finally:
        profile.down()
    assert not any(state.running for state in profile.status())
    shutil.rmtree(root.parent, ignore_errors=True)
