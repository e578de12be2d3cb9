"""AgentDojo's task suites as a table, read from the installed `agentdojo` package."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import polars as pl

from rvu_pipelines.data.catalog import CountMismatch
from rvu_pipelines.data.specs import AgentDojoSpec
from rvu_pipelines.errors import DatasetUnavailableError


def installed_agentdojo_version() -> str:
    try:
        return version("agentdojo")
    except PackageNotFoundError:
        raise DatasetUnavailableError(
            "AgentDojo task suites come from the `agentdojo` package, which is not installed: "
            "`pip install agentdojo==0.1.35` (the project's set-up does this)."
        ) from None


def load_agentdojo_suites(spec: AgentDojoSpec) -> pl.DataFrame:
    """One row per suite: user tasks, injection tasks and tools, at the pinned benchmark version."""
    installed_agentdojo_version()
    from agentdojo.task_suite.load_suites import get_suites

    try:
        suites = get_suites(spec.benchmark_version)
    except Exception as exc:  # unknown version string
        raise DatasetUnavailableError(
            f"agentdojo {installed_agentdojo_version()} has no benchmark version "
            f"'{spec.benchmark_version}' (configs/datasets.yaml agentdojo.benchmark_version): {exc}"
        ) from exc
    rows = [
        {
            "suite": name,
            "benchmark_version": spec.benchmark_version,
            "user_tasks": len(suite.user_tasks),
            "injection_tasks": len(suite.injection_tasks),
            "tools": len(suite.tools),
        }
        for name, suite in sorted(suites.items())
    ]
    return pl.DataFrame(rows)


def check_suite_counts(spec: AgentDojoSpec, frame: pl.DataFrame) -> list[CountMismatch]:
    observed = {row["suite"]: row for row in frame.iter_rows(named=True)}
    problems = []
    for suite in sorted(set(spec.suites) | set(observed)):
        expected = spec.suites.get(suite)
        row = observed.get(suite)
        for key in ("user_tasks", "injection_tasks"):
            want = getattr(expected, key) if expected else 0
            have = row[key] if row else 0
            if want != have:
                problems.append(CountMismatch(f"{suite} {key}", want, have))
    return problems
