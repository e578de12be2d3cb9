"""InjecAgent and BIPIA hand the agent the injected tool result before it acts (their protocols); every
defense executes that pre-filled call through its own tool boundary, so the model always reads the
injection — and the classifier sees it too."""

from __future__ import annotations

from agentdojo.types import get_text_content_as_str

from rvu_pipelines.agents.defenses import DefenseSettings, build_pipeline
from rvu_pipelines.detectors.heuristic import HeuristicDetector
from rvu_pipelines.scenarios.contract import prefill_calls
from rvu_pipelines.scenarios.registry import canonical_scenarios


def test_prefilled_call_runs_first_through_each_defense(smollm, shared_data) -> None:
    scenarios = {s.benchmark: s for s in canonical_scenarios()}
    injec, bipia, dojo = scenarios["injecagent_dh"], scenarios["bipia_email"], scenarios["agentdojo"]
    assert [c.function for c in prefill_calls(injec)] == [injec.user_tool]
    assert prefill_calls(injec)[0].args  # the case's own parameters, parsed from InjecAgent's literal
    assert [c.function for c in prefill_calls(bipia)] == [bipia.read_tool]
    assert prefill_calls(dojo) == ()  # AgentDojo starts from the bare user query

    settings = DefenseSettings(detector=HeuristicDetector(), max_tokens=8, max_iters=1)
    for defense in ("vanilla", "rvg"):
        outcome = injec.run(build_pipeline(defense, smollm, injec, settings))
        roles = [m["role"] for m in outcome.messages]
        assert roles[:4] == ["system", "user", "assistant", "tool"], roles
        assert outcome.messages[2]["tool_calls"][0].function == injec.user_tool
        assert injec.injection in get_text_content_as_str(outcome.messages[3]["content"])
        assert outcome.details["injection_seen"]
