"""`make test`'s worker scheduling (tests/conftest.py): a module, or the group it shares a worker with, runs on one
pytest-xdist worker, so its fixtures are built once; the lists that steer it name files that exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULES = tuple(f"tests/platform/test_{name}.py" for name in ("bounded_io", "atomic_write", "settings"))

RECORDER = """
import json, os
def pytest_runtest_logreport(report):
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # unset in the controller, which sees every report again
    if worker and report.when == "call":
        with open(os.environ["WORKER_LOG"], "a") as out:
            out.write(json.dumps([worker, report.nodeid]) + "\\n")
"""


def _suite_conftest(config: pytest.Config) -> Any:
    """tests/conftest.py as pytest loaded it (importing it by name would find whichever conftest.py is first on
    the path, and loading it again would pin the worker's cores a second time)."""
    path = REPO / "tests" / "conftest.py"
    return next(p for p in config.pluginmanager.get_plugins() if getattr(p, "__file__", None) == str(path))


def test_the_lists_name_modules_that_exist(pytestconfig: pytest.Config) -> None:
    suite = _suite_conftest(pytestconfig)
    for module in (*suite.SHARED_WORKER, *suite.HEAVY_MODULES):
        assert (REPO / module).is_file(), module
    groups = set(suite.SHARED_WORKER.values())
    for unit in suite.LONG_MODULES:
        assert unit in groups or (REPO / unit).is_file(), unit
    assert suite.work_unit_of("tests/detectors/test_overdefense.py::test_x[a]") == "overdefense-set"
    assert suite.work_unit_of("tests/platform/test_cli.py::test_y") == "tests/platform/test_cli.py"


def test_each_module_runs_on_one_worker(tmp_path: Path) -> None:
    """Three modules over two workers: every test of a module reports from the same worker. (pytest-xdist's own
    ``xdist_group`` marks stopped grouping under pytest 9, and each test went out alone.)"""
    (tmp_path / "worker_recorder.py").write_text(RECORDER)
    log = tmp_path / "workers.jsonl"
    # a run of its own: nothing of the pytest-xdist worker this test may itself be running in
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    env |= {"PYTHONPATH": str(tmp_path), "WORKER_LOG": str(log)}
    command = [sys.executable, "-m", "pytest", *MODULES, "-n", "2", "--dist", "loadgroup", "-p", "worker_recorder"]
    done = subprocess.run([*command, "-q", "-p", "no:cacheprovider"], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for line in log.read_text().splitlines():
        worker, nodeid = json.loads(line)
        workers[nodeid.split("::", 1)[0]].add(worker)
    assert set(workers) == set(MODULES)
    assert all(len(ran_on) == 1 for ran_on in workers.values()), dict(workers)
    assert set().union(*workers.values()) == {"gw0", "gw1"}  # and both workers had work
