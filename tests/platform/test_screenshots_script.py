"""scripts/screenshots.py's pure parts, without a browser or a server: the URLs it opens, the port it picks, which
MLflow runs it compares (and the error that says to run `make run` when there are none), the wheel arithmetic that
fits Dagster's graph, and that main() reports a failure as one line and exit status 1."""

from __future__ import annotations

import importlib.util
import json
import signal
import socket
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shots() -> Iterator[ModuleType]:
    """scripts/ is a folder of scripts, not a package: load it by path (registered, as its dataclass needs)."""
    spec = importlib.util.spec_from_file_location("screenshots", REPO / "scripts" / "screenshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["screenshots"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("screenshots", None)


def _experiment(shots: ModuleType, name: str, statuses: list[str], experiment_id: str = "1") -> Any:
    runs = tuple((f"{name}-run{i}", f"{name}-{i}", status) for i, status in enumerate(statuses))
    return shots.Experiment(experiment_id, name, runs)


def test_free_port_is_bindable(shots: ModuleType) -> None:
    port = shots.free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((shots.HOST, port))


def test_dagster_job_url_is_the_job_page(shots: ModuleType) -> None:
    url = shots.dagster_job_url("http://127.0.0.1:3000/", "__repository__", "rvu", "default_profile_job")
    assert url == "http://127.0.0.1:3000/locations/__repository__@rvu/jobs/default_profile_job"


def test_mlflow_compare_url_carries_json_lists(shots: ModuleType) -> None:
    url = shots.mlflow_compare_url("http://127.0.0.1:5000", ["a1", "b2"], ["7"])
    base, fragment = url.split("#", 1)
    assert base == "http://127.0.0.1:5000/"
    route, query = fragment.split("?", 1)
    assert route == "/compare-runs"
    params = urllib.parse.parse_qs(query)
    assert json.loads(params["runs"][0]) == ["a1", "b2"]
    assert json.loads(params["experiments"][0]) == ["7"]


def test_sqlite_uri_made_absolute(shots: ModuleType, tmp_path: Path) -> None:
    assert shots.sqlite_uri_absolute("sqlite:///.rvu/mlflow.db", tmp_path) == f"sqlite:///{tmp_path}/.rvu/mlflow.db"
    assert shots.sqlite_uri_absolute("sqlite:////abs/mlflow.db", tmp_path) == "sqlite:////abs/mlflow.db"
    assert shots.sqlite_uri_absolute("http://127.0.0.1:5001", tmp_path) == "http://127.0.0.1:5001"


def test_no_runs_says_make_run(shots: ModuleType) -> None:
    empty = [shots.Experiment("0", "Default", ())]
    with pytest.raises(shots.ScreenshotError, match="no MLflow runs in sqlite:///x.db: run `make run` first"):
        shots.choose_runs(empty, None, "sqlite:///x.db")
    with pytest.raises(shots.ScreenshotError, match="make run"):
        shots.choose_runs([], None, "sqlite:///x.db")


def test_one_run_is_not_a_comparison(shots: ModuleType) -> None:
    lonely = [_experiment(shots, "rvu-memory", ["FINISHED"])]
    with pytest.raises(shots.ScreenshotError, match="needs two: run `make run` first"):
        shots.choose_runs(lonely, None, "store")


def test_the_experiment_with_most_runs_wins(shots: ModuleType) -> None:
    experiments = [
        _experiment(shots, "rvu-memory", ["FINISHED"] * 2, "1"),
        _experiment(shots, "rvu-detectors", ["FINISHED"] * 3, "2"),
    ]
    chosen, run_ids = shots.choose_runs(experiments, None, "store")
    assert chosen.name == "rvu-detectors"
    assert run_ids == ["rvu-detectors-run0", "rvu-detectors-run1", "rvu-detectors-run2"]


def test_named_experiment_and_its_errors(shots: ModuleType) -> None:
    experiments = [
        _experiment(shots, "rvu-memory", ["FINISHED"] * 2, "1"),
        _experiment(shots, "rvu-detectors", ["FINISHED"] * 3, "2"),
    ]
    chosen, _ = shots.choose_runs(experiments, "rvu-memory", "store")
    assert chosen.name == "rvu-memory"
    with pytest.raises(shots.ScreenshotError, match=r"no MLflow experiment named 'nope'.*rvu-detectors \(3 runs\)"):
        shots.choose_runs(experiments, "nope", "store")


def test_finished_runs_first_and_capped(shots: ModuleType) -> None:
    statuses = ["FAILED", "FINISHED", "RUNNING", "FINISHED", "FINISHED", "FINISHED", "FINISHED"]
    _, run_ids = shots.choose_runs([_experiment(shots, "e", statuses)], None, "store")
    assert len(run_ids) == shots.MAX_COMPARED_RUNS
    assert run_ids == ["e-run1", "e-run3", "e-run4", "e-run5"]
    _, few = shots.choose_runs([_experiment(shots, "e", ["FAILED", "FINISHED"])], None, "store")
    assert few == ["e-run1", "e-run0"]


@pytest.mark.parametrize(("scale", "target"), [(1.0, 0.4), (0.86, 0.81), (0.3, 0.9), (0.5, 0.52)])
def test_zoom_wheel_delta_reaches_the_target(shots: ModuleType, scale: float, target: float) -> None:
    """Dagster's handler: scale * (1 - deltaY * k), k = 0.002 above |deltaY| = 30 and 0.01 at or below."""
    delta = shots.zoom_wheel_delta(scale, target)
    k = 0.002 if abs(delta) > 30 else 0.01
    assert scale * (1 - delta * k) == pytest.approx(target)


def test_local_storage_presets_only_their_origin(shots: ModuleType) -> None:
    source = shots.local_storage_js("http://127.0.0.1:4000", {"communityNux": '"1"'})
    assert source.startswith('if (location.origin === "http://127.0.0.1:4000")')
    assert 'localStorage.setItem("communityNux", "\\"1\\"");' in source


def test_text_ready_js_embeds_its_needles(shots: ModuleType) -> None:
    source = shots.text_ready_js(["datasets", "models"], minimum=2, absent=["Loading"])
    assert '["datasets", "models"]' in source and '["Loading"]' in source and "found >= 2" in source


def test_main_reports_an_error_in_one_line(
    shots: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No browser, no servers: take() fails as it would on an empty store; the signal handlers are put back."""

    def no_runs(*_args: object) -> None:
        raise shots.ScreenshotError("no MLflow runs in sqlite:///x.db: run `make run` first")

    monkeypatch.setattr(shots, "take", no_runs)
    before = signal.getsignal(signal.SIGTERM)
    assert shots.main(["--only", "mlflow-comparison"]) == 1
    assert signal.getsignal(signal.SIGTERM) is before
    err = capsys.readouterr().err
    assert "screenshots: error: no MLflow runs in sqlite:///x.db: run `make run` first" in err
