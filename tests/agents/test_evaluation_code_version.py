"""Episode rows record the code version that produced them; a stored row is reused only under the same
code version, and ``rerun=True`` (nightly sweep, ``rvu regress``) re-runs every episode. The code
version itself is deterministic and falls back to a package hash without git."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from rvu_pipelines import code_version as cv
from rvu_pipelines.agents.evaluation import CellSpec, attack_table, cell_path, run_cell


@dataclass(frozen=True)
class _Scenario:
    scenario_id: str
    benchmark: str = "canonical"


SCENARIOS = [_Scenario(f"s{i}") for i in range(3)]
SPEC = CellSpec("canonical", "rvg", "tiny")


def _run(root: Path, calls: list[str], version: str | None = None, rerun: bool = False):
    def episode(scenario, workdir):
        calls.append(scenario.scenario_id)
        return {"scenario_id": scenario.scenario_id, "attack_succeeded": False, "utility": 1.0, "latency_s": 0.1}

    return run_cell(
        SPEC,
        SCENARIOS,
        episode,
        llm=None,
        model_id="m",
        settings_fingerprint="f",
        root=root,
        progress=False,
        code_version=version,
        rerun=rerun,
    )


def test_rows_are_reused_only_under_the_same_code_version(tmp_path: Path) -> None:
    calls: list[str] = []
    first = _run(tmp_path, calls, "v1")
    assert calls == ["s0", "s1", "s2"] and first.rows["code_version"].to_list() == ["v1"] * 3
    assert first.code_version == "v1" and attack_table([first])["code_version"].to_list() == ["v1"]

    calls.clear()
    same = _run(tmp_path, calls, "v1")  # interactive re-materialization: same code, nothing re-runs
    assert calls == [] and same.reused_episodes == 3 and not same.rerun

    calls.clear()
    changed = _run(tmp_path, calls, "v2")  # new code: every row is re-run and replaced
    assert calls == ["s0", "s1", "s2"] and changed.rows["code_version"].to_list() == ["v2"] * 3
    assert changed.rows.height == 3  # replaced under the same key, not appended

    calls.clear()
    nightly = _run(tmp_path, calls, "v2", rerun=True)  # the nightly sweep: re-run even under the same code
    assert calls == ["s0", "s1", "s2"] and nightly.new_episodes == 3 and nightly.reused_episodes == 0
    assert nightly.rerun


def test_rows_without_a_code_version_are_not_reused(tmp_path: Path) -> None:
    import polars as pl

    calls: list[str] = []
    _run(tmp_path, calls, "v1")
    path = cell_path(tmp_path, SPEC)
    pl.read_parquet(path).drop("code_version").write_parquet(path)  # a file written before versions
    calls.clear()
    _run(tmp_path, calls, "v1")
    assert calls == ["s0", "s1", "s2"]


def test_default_code_version_is_this_process_version(tmp_path: Path) -> None:
    run = _run(tmp_path, [])
    assert run.code_version == cv.code_version() and run.rows["code_version"].to_list() == [run.code_version] * 3


def test_code_version_is_git_commit_or_package_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    version = cv.code_version()
    assert version == cv.code_version()  # computed once
    git = cv.git_version()
    if git is not None:  # a checkout: the commit, with -dirty+<package hash> when the tree differs
        assert version == git and len(git.split("-")[0]) == 40
    else:
        assert version == f"sha256:{cv.package_hash()[:16]}"

    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "data.txt").write_text("not code")
    first = cv.package_hash(package)
    assert first == cv.package_hash(package) and len(first) == 64
    (package / "data.txt").write_text("still not code")
    assert cv.package_hash(package) == first
    (package / "sub" / "b.py").write_text("y = 3\n")
    assert cv.package_hash(package) != first
    assert cv.git_version(package) is None  # a folder outside any checkout's top: no git version

    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))  # git not installed
    assert cv.git_version() is None
