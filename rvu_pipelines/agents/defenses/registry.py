"""Defenses by name: each defense's module registers the function that assembles its AgentDojo pipeline
(``@defense_builder("name")``), and :func:`rvu_pipelines.agents.defenses.builder.build_pipeline` asks for it.

A builder gets the :class:`EpisodeStart` every defense shares (the LLM element, the first agent turn, the
episode trace), the scenario and the settings, and returns its pipeline elements (or a finished
:class:`DefensePipeline`). The table's axis of defenses (``scenarios.axes.DEFENSES``, which the Dagster
partitions read without importing AgentDojo) must name exactly the registered ones; a test checks it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement

from rvu_pipelines.agents.defenses.elements import DefensePipeline, EpisodeTrace
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.plugins import import_package_modules
from rvu_pipelines.scenarios.contract import Scenario


@dataclass(frozen=True)
class EpisodeStart:
    """What every defense's pipeline is built from: the LLM element, the first agent turn (the LLM, or the
    benchmark protocol's pre-filled tool call), whether that turn is pre-filled, and the episode's trace."""

    llm: BasePipelineElement
    first: BasePipelineElement
    prefilled: bool
    trace: EpisodeTrace


Built = Union[list[BasePipelineElement], DefensePipeline]  # noqa: UP007 (a runtime alias under 3.11)
# (defense name, start, scenario, the builder module's DefenseSettings: typed Any to keep this module below it)
DefenseBuilder = Callable[[str, EpisodeStart, Scenario, Any], Built]

_BUILDERS: dict[str, DefenseBuilder] = {}


def defense_builder(*names: str) -> Callable[[DefenseBuilder], DefenseBuilder]:
    """Register the decorated builder for each defense in ``names`` (one builder may serve several)."""

    def register(build: DefenseBuilder) -> DefenseBuilder:
        for name in names:
            existing = _BUILDERS.get(name)
            if existing is not None and existing is not build:
                raise ConfigError(
                    f"Two builders are registered for the defense '{name}': "
                    f"{existing.__module__}.{existing.__name__} and {build.__module__}.{build.__name__}."
                )
            _BUILDERS[name] = build
        return build

    return register


def registered_defenses() -> tuple[str, ...]:
    """Every defense a module of this package registers, sorted."""
    import_package_modules("rvu_pipelines.agents.defenses")
    return tuple(sorted(_BUILDERS))


def builder_for(defense: str, allowed: tuple[str, ...]) -> DefenseBuilder:
    """The builder of ``defense``, or a clear error naming the allowed defenses."""
    import_package_modules("rvu_pipelines.agents.defenses")
    if defense not in allowed or defense not in _BUILDERS:
        raise ConfigError(f"Unknown defense '{defense}'; allowed values: {', '.join(allowed)}.")
    return _BUILDERS[defense]
