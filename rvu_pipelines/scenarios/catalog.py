"""Benchmarks by name: each benchmark's module registers a :class:`BenchmarkSpec` (its name on the table, the
scenario-id prefix it owns, and how to list its scenarios), and :mod:`rvu_pipelines.scenarios.registry`
asks for it. The table's axis (``scenarios.axes.BENCHMARKS``, which the Dagster partitions read without
importing AgentDojo) must name exactly the registered benchmarks; a test checks it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.plugins import import_package_modules
from rvu_pipelines.scenarios.contract import Scenario


@dataclass(frozen=True)
class BenchmarkSpec:
    """``scenarios(config)`` lists every scenario in a fixed order (``config``: the benchmarks config, or None
    for the default file); ``find(scenario_id, config)`` may resolve one id without listing them all."""

    name: str
    id_prefix: str  # every scenario id of this benchmark starts with it, e.g. "injecagent/dh/"
    id_shape: str  # for error messages, e.g. "injecagent/dh/<case>"
    scenarios: Callable[[Any], Sequence[Scenario]]
    find: Callable[[str, Any], Scenario | None] | None = None


_BENCHMARKS: dict[str, BenchmarkSpec] = {}


def register_benchmark(spec: BenchmarkSpec) -> BenchmarkSpec:
    existing = _BENCHMARKS.get(spec.name)
    if existing is not None and existing.scenarios.__module__ != spec.scenarios.__module__:
        raise ConfigError(
            f"Two benchmarks are registered as '{spec.name}': in {existing.scenarios.__module__} and "
            f"{spec.scenarios.__module__}."
        )
    _BENCHMARKS[spec.name] = spec
    return spec


def registered_benchmarks() -> dict[str, BenchmarkSpec]:
    """Every benchmark a module of this package registers, by name (sorted)."""
    import_package_modules("rvu_pipelines.scenarios")
    return dict(sorted(_BENCHMARKS.items()))


def benchmark_spec(name: str, allowed: Sequence[str]) -> BenchmarkSpec:
    """The benchmark ``name``, or a clear error naming the allowed ones."""
    found = registered_benchmarks().get(name)
    if found is None or name not in allowed:
        raise ConfigError(f"Unknown benchmark '{name}'; allowed values: {', '.join(allowed)}.")
    return found


def spec_for_id(scenario_id: str, allowed: Sequence[str]) -> BenchmarkSpec:
    """The benchmark whose id prefix ``scenario_id`` carries, or a clear error with the id shapes."""
    registered = registered_benchmarks()
    specs = [registered[name] for name in allowed if name in registered]
    for spec in specs:
        if scenario_id.startswith(spec.id_prefix):
            return spec
    shapes = ", ".join(f"'{spec.id_shape}'" for spec in specs)
    raise ConfigError(f"Scenario id '{scenario_id}' names no benchmark; ids look like {shapes}.")
