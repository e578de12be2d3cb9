"""Attack scenarios from the real benchmarks (InjecAgent, BIPIA, AgentDojo) behind one contract,
:class:`~rvu_pipelines.scenarios.contract.Scenario`: each runs one episode through any AgentDojo pipeline
and is judged by its benchmark's own protocol (rvu_pipelines/scenarios/judges.py documents every judge).

The attack side of the platform: rvu_pipelines.agents (the defenses, the harness) imports this package,
never the reverse. The package root exports only what loads without AgentDojo (the table's axes, the
contract, ``scenarios_for``), because the Dagster code location imports it; the loaders and the scenario
classes are in ``registry``, ``injecagent``, ``bipia`` and ``agentdojo_tasks``, which import AgentDojo.
"""

from rvu_pipelines.scenarios.axes import BENCHMARKS, CANONICAL, DEFENSES, RECOVERING_DEFENSES
from rvu_pipelines.scenarios.contract import Scenario, ScenarioOutcome, prefill_calls
from rvu_pipelines.scenarios.selection import scenarios_for

__all__ = [
    "BENCHMARKS",
    "CANONICAL",
    "DEFENSES",
    "RECOVERING_DEFENSES",
    "Scenario",
    "ScenarioOutcome",
    "prefill_calls",
    "scenarios_for",
]
