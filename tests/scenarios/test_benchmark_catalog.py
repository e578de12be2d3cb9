"""Benchmarks by name: each benchmark module registers how to list its scenarios, and the table's axis names
exactly the registered benchmarks."""

from __future__ import annotations

import pytest

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios import catalog
from rvu_pipelines.scenarios.axes import BENCHMARKS
from rvu_pipelines.scenarios.catalog import BenchmarkSpec, benchmark_spec, register_benchmark, spec_for_id


def test_the_axis_names_exactly_the_registered_benchmarks() -> None:
    registered = catalog.registered_benchmarks()
    assert sorted(registered) == sorted(BENCHMARKS)
    assert registered["bipia_code"].scenarios.__module__ == "rvu_pipelines.scenarios.bipia"
    assert registered["agentdojo"].find is not None  # one AgentDojo triple resolves without listing the suites


def test_ids_and_names_resolve_to_their_benchmark_or_a_clear_error() -> None:
    assert spec_for_id("injecagent/ds/12", BENCHMARKS).name == "injecagent_ds"
    assert spec_for_id("bipia/table/3/task_automation-1/end", BENCHMARKS).name == "bipia_table"
    assert spec_for_id("agentdojo/banking/user_task_0/injection_task_1", BENCHMARKS).name == "agentdojo"
    with pytest.raises(ConfigError, match="names no benchmark; ids look like 'injecagent/dh/<case>'"):
        spec_for_id("tensortrust/1", BENCHMARKS)
    with pytest.raises(ConfigError, match="Unknown benchmark 'bipia'; allowed values: injecagent_dh"):
        benchmark_spec("bipia", BENCHMARKS)
    with pytest.raises(ConfigError, match="Unknown benchmark 'agentdojo'"):
        benchmark_spec("agentdojo", ("injecagent_dh",))  # registered, but not on the axis the caller allows


def test_a_second_benchmark_with_a_taken_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "_BENCHMARKS", dict(catalog._BENCHMARKS))

    def elsewhere(config: object) -> list:
        return []

    elsewhere.__module__ = "somebody.else"
    with pytest.raises(ConfigError, match="Two benchmarks are registered as 'agentdojo'"):
        register_benchmark(BenchmarkSpec("agentdojo", "agentdojo/", "agentdojo/<x>", elsewhere))
