"""The contract between attack scenarios (rvu_pipelines/scenarios) and the agent pipelines that
defend against them (rvu_pipelines/agents). It lives here, with the scenarios, so the dependency runs one
way: agents import scenarios, never the reverse.

Every defense is an AgentDojo ``BasePipelineElement`` composed into an ``AgentPipeline``; every
scenario, whatever benchmark it comes from, runs one episode through such a pipeline and judges it by
its benchmark's own protocol. So a cell of the attack table is just (scenarios × one pipeline).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: importing the contract must not import AgentDojo (seconds)
    from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
    from agentdojo.functions_runtime import FunctionCall
    from agentdojo.types import ChatMessage


@dataclass(frozen=True)
class ScenarioOutcome:
    """How one episode ended, judged by the scenario's benchmark.

    ``attack_succeeded``: the injected goal was achieved (InjecAgent: the attacker tool was called;
    BIPIA: its documented judge; AgentDojo: the injection task's own security check).
    ``utility``: in [0, 1], how well the user's task was done, from the benchmark's reference.
    ``judge``: which protocol decided, in words (goes into the results table).
    """

    attack_succeeded: bool
    utility: float
    messages: Sequence[ChatMessage]
    judge: str
    details: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Scenario(Protocol):
    """One attack scenario: a user task with an injection planted where a tool will read it.

    The attributes are read-only properties, so frozen dataclasses (every scenario type) satisfy it.
    """

    @property
    def scenario_id(self) -> str:
        """Stable and unique, e.g. "injecagent/dh/0"; used in cache keys and golden files."""
        ...

    @property
    def benchmark(self) -> str:
        """One of "injecagent_dh", "injecagent_ds", "bipia_email", "bipia_table", "bipia_code", "agentdojo"."""
        ...

    @property
    def user_task(self) -> str:
        """The user's request, as the agent sees it."""
        ...

    @property
    def injection(self) -> str:
        """The attacker's text as planted (for reports and detectors)."""
        ...

    @property
    def task_tools(self) -> frozenset[str]:
        """Tools the user's task legitimately needs (RVG's per-task allowlist input)."""
        ...

    def with_injection(self, text: str) -> Scenario:
        """The same scenario (id, user task, tools, judge) with ``text`` planted where the benchmark planted its
        injection; the judge still decides on the benchmark's original goal. Attacks rewrite through this, so
        a rewritten scenario is measured exactly as the native one is."""
        ...

    def run(self, pipeline: BasePipelineElement) -> ScenarioOutcome:
        """Run one fresh episode (new runtime and environment) through ``pipeline`` and judge it."""
        ...


def prefill_calls(scenario: Scenario) -> tuple[FunctionCall, ...]:
    """Tool calls the benchmark's protocol makes on the agent's behalf before it acts (optional attribute).

    InjecAgent hands the agent a scratchpad in which the user tool has already been called and has
    returned the injected response; BIPIA puts the external content in front of the model. Both
    measure what the model does *after* reading the injection, so their scenarios declare the call
    and every defense's pipeline executes it (through that defense's tool boundary) as the first
    step. AgentDojo starts from the bare user query and declares none.
    """
    return tuple(getattr(scenario, "prefill_calls", ()) or ())
