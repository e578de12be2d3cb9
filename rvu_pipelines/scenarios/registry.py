"""Which scenarios exist: ``load_scenarios`` (a fixed-seed sample of one benchmark),
``canonical_scenarios`` (the paper's 10, listed in configs/benchmarks.yaml) and ``scenario_by_id``; each
benchmark's own module registers how to list its scenarios (:mod:`rvu_pipelines.scenarios.catalog`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.paths import config_dir
from rvu_pipelines.scenarios.axes import BENCHMARKS
from rvu_pipelines.scenarios.catalog import benchmark_spec, spec_for_id
from rvu_pipelines.scenarios.common import fixed_sample
from rvu_pipelines.scenarios.contract import Scenario

CANONICAL_COUNT = 10


@dataclass(frozen=True)
class CanonicalEntry:
    scenario_id: str
    why: str


@dataclass(frozen=True)
class BenchmarksConfig:
    """configs/benchmarks.yaml, validated."""

    path: Path
    agentdojo_version: str
    agentdojo_attack: str
    agentdojo_suites: dict[str, tuple[list[str] | None, list[str] | None]]
    canonical: tuple[CanonicalEntry, ...]


def _ids(value: Any, where: str) -> list[str] | None:
    if value in (None, "all"):
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"{where} must be 'all' or a list of task ids, got {value!r}.")


def load_benchmarks_config(path: Path | None = None) -> BenchmarksConfig:
    """Read and validate configs/benchmarks.yaml (or ``path``)."""
    path = Path(path) if path else config_dir() / "benchmarks.yaml"
    if not path.is_file():
        raise ConfigError(
            f"The benchmarks config {path} does not exist; restore configs/benchmarks.yaml "
            "from the repository or set RVU_CONFIG_DIR."
        )
    raw = yaml.safe_load(path.read_text()) or {}
    ad = raw.get("agentdojo")
    if not isinstance(ad, dict) or not isinstance(ad.get("suites"), dict):
        raise ConfigError(f"{path}: 'agentdojo.suites' must map suite name -> {{user_tasks, injection_tasks}}.")
    selection = {}
    for suite, spec in ad["suites"].items():
        spec = spec or {}
        selection[str(suite)] = (
            _ids(spec.get("user_tasks"), f"{path}: agentdojo.suites.{suite}.user_tasks"),
            _ids(spec.get("injection_tasks"), f"{path}: agentdojo.suites.{suite}.injection_tasks"),
        )
    entries = raw.get("canonical")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "id" in e for e in entries):
        raise ConfigError(f"{path}: 'canonical' must be a list of {{id, why}} entries.")
    canonical = tuple(CanonicalEntry(str(e["id"]), str(e.get("why", ""))) for e in entries)
    ids = [e.scenario_id for e in canonical]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{path}: 'canonical' lists an id twice: {sorted(i for i in ids if ids.count(i) > 1)}.")
    return BenchmarksConfig(
        path,
        str(ad.get("benchmark_version", "v1.2.2")),
        str(ad.get("attack", "important_instructions")),
        selection,
        canonical,
    )


def all_scenarios(benchmark: str, config: BenchmarksConfig | None = None) -> list[Scenario]:
    """Every scenario of one benchmark (AgentDojo: the configured subset), in a fixed order."""
    return list(benchmark_spec(benchmark, BENCHMARKS).scenarios(config))


def load_scenarios(benchmark: str, *, limit: int | None = None, seed: int = 42) -> list[Scenario]:
    """A fixed-seed sample of ``limit`` scenarios of one benchmark (all when None), in benchmark order."""
    scenarios = all_scenarios(benchmark)
    return [scenarios[i] for i in fixed_sample(len(scenarios), limit, seed)]


def scenario_by_id(scenario_id: str, config: BenchmarksConfig | None = None) -> Scenario:
    """Resolve one scenario id (``injecagent/dh/3``, ``bipia/email/0/<attack>/<pos>``, ``agentdojo/...``)."""
    spec = spec_for_id(scenario_id, BENCHMARKS)
    if spec.find is not None and (found := spec.find(scenario_id, config)) is not None:
        return found
    for scenario in spec.scenarios(config):
        if scenario.scenario_id == scenario_id:
            return scenario
    raise ConfigError(f"Scenario id '{scenario_id}' does not exist in benchmark '{spec.name}'.")


def canonical_scenarios(config: BenchmarksConfig | None = None) -> list[Scenario]:
    """The paper's 10 canonical scenarios, in the order configs/benchmarks.yaml lists them."""
    config = config or load_benchmarks_config()
    if len(config.canonical) != CANONICAL_COUNT:
        raise ConfigError(
            f"{config.path}: 'canonical' must list exactly {CANONICAL_COUNT} scenario ids, "
            f"it lists {len(config.canonical)}."
        )
    return [scenario_by_id(entry.scenario_id, config) for entry in config.canonical]


__all__ = [
    "BENCHMARKS",
    "all_scenarios",
    "canonical_scenarios",
    "load_benchmarks_config",
    "load_scenarios",
    "scenario_by_id",
]
