"""Attack scenarios from the real benchmarks (InjecAgent, BIPIA, AgentDojo) behind one contract,
``rvu_pipelines.agents.scenario.Scenario``: each runs one episode through any AgentDojo pipeline and is
judged by its benchmark's own protocol (rvu_pipelines/scenarios/judges.py documents every judge).
"""

from rvu_pipelines.scenarios.agentdojo_tasks import AgentDojoScenario
from rvu_pipelines.scenarios.bipia import BipiaScenario
from rvu_pipelines.scenarios.injecagent import InjecAgentScenario
from rvu_pipelines.scenarios.registry import (
    BENCHMARKS,
    all_scenarios,
    canonical_scenarios,
    load_benchmarks_config,
    load_scenarios,
    scenario_by_id,
)

__all__ = [
    "BENCHMARKS",
    "AgentDojoScenario",
    "BipiaScenario",
    "InjecAgentScenario",
    "all_scenarios",
    "canonical_scenarios",
    "load_benchmarks_config",
    "load_scenarios",
    "scenario_by_id",
]
