"""`dagster dev -w workspace.yaml` on loopback serves the code location with every asset."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from assets.definitions import defs

REPO = Path(__file__).resolve().parents[2]
QUERY = """{ workspaceOrError { ... on Workspace { locationEntries { name locationOrLoadError {
  __typename ... on RepositoryLocation { repositories { name assetNodes { assetKey { path } } } }
  ... on PythonError { message } } } } } }"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.integration
def test_dagster_dev_loads_the_code_location_with_all_assets(tmp_path) -> None:
    port = _free_port()
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    dagster = Path(sys.executable).with_name("dagster")
    process = subprocess.Popen(
        [str(dagster), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO,
        # a state folder of its own: the incident sensor starts RUNNING, and would launch recoveries of the logs
        # other tests left in the session's inbox, which dagster dev then waits for when stopped
        env={**os.environ, "DAGSTER_HOME": str(home), "RVU_HOME": str(tmp_path / "rvu_home")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        expected = {key.to_user_string() for key in defs.get_repository_def().asset_graph.get_all_asset_keys()}
        deadline, served, last = time.monotonic() + 180, set(), None
        while time.monotonic() < deadline:
            try:
                last = requests.post(f"http://127.0.0.1:{port}/graphql", json={"query": QUERY}, timeout=10).json()
                entries = last["data"]["workspaceOrError"]["locationEntries"]
                location = entries[0]["locationOrLoadError"] if entries else None
                if location and location["__typename"] == "RepositoryLocation":
                    served = {
                        "/".join(node["assetKey"]["path"])
                        for repo in location["repositories"]
                        for node in repo["assetNodes"]
                    }
                    break
                if location and location["__typename"] == "PythonError":
                    pytest.fail(f"code location failed to load: {location['message']}")
            except (requests.ConnectionError, requests.ReadTimeout, KeyError, TypeError, ValueError):
                pass
            time.sleep(0.5)
        assert entries[0]["name"] == "rvu", last
        assert served == expected
    finally:
        # stopped as Ctrl-C would; what is measured is the load, so a daemon slow to wind down (30 s and more late
        # in a long test session, in seconds when run alone) is killed after a short grace, while this worker's core
        # would otherwise sit idle
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
