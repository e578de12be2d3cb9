"""Scenarios from the real benchmarks, on the real mirror, run through real AgentDojo pipelines.

The policies here are deterministic scripted ``BasePipelineElement``s (an "attacker-obeying" run and a
"benign" run of the same scenario), so each judge is seen to say yes *and* no.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import pytest
from agentdojo.agent_pipeline.agent_pipeline import AgentPipeline
from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.basic_elements import InitQuery, SystemMessage
from agentdojo.agent_pipeline.ground_truth_pipeline import GroundTruthPipeline
from agentdojo.agent_pipeline.tool_execution import ToolsExecutionLoop, ToolsExecutor
from agentdojo.functions_runtime import EmptyEnv, FunctionCall
from agentdojo.types import ChatAssistantMessage, get_text_content_as_str, text_content_block_from_string

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.axes import protocol_benchmark
from rvu_pipelines.scenarios.contract import Scenario
from rvu_pipelines.scenarios.registry import (
    BENCHMARKS,
    canonical_scenarios,
    load_benchmarks_config,
    load_scenarios,
    scenario_by_id,
)

FULL_COUNTS = {
    "injecagent_dh": 510,
    "injecagent_ds": 544,
    "bipia_email": 50 * 75,
    "bipia_table": 100 * 75,
    "bipia_code": 50 * 50,
    "agentdojo": 16 * 9 + 21 * 5,
    "agentdojo_banking": 16 * 9,
    "agentdojo_slack": 21 * 5,
    "agentdojo_travel": 20 * 7,
    "agentdojo_workspace": 40 * 14,
}


class ScriptedPolicy(BasePipelineElement):
    """Emits ``calls[k]`` as its k-th reply, then a final answer computed from the last tool result."""

    def __init__(self, calls: Sequence[tuple[str, dict]], answer: Callable[[str], str]) -> None:
        self.calls, self.answer = list(calls), answer

    def query(self, query, runtime, env=EmptyEnv(), messages=(), extra_args={}):  # noqa: B006
        k = sum(1 for m in messages if m["role"] == "assistant")
        if k < len(self.calls):
            name, args = self.calls[k]
            reply = ChatAssistantMessage(
                role="assistant", content=None, tool_calls=[FunctionCall(function=name, args=args, id=f"c{k}")]
            )
        else:
            last_tool = next((m for m in reversed(messages) if m["role"] == "tool"), None)
            seen = get_text_content_as_str(last_tool["content"]) if last_tool else ""
            reply = ChatAssistantMessage(
                role="assistant", tool_calls=None, content=[text_content_block_from_string(self.answer(seen))]
            )
        return query, runtime, env, [*messages, reply], extra_args


def agent(policy: BasePipelineElement) -> AgentPipeline:
    """The usual AgentDojo agent shape, with the policy in the LLM's place."""
    return AgentPipeline(
        [
            SystemMessage("You are a helpful assistant."),
            InitQuery(),
            policy,
            ToolsExecutionLoop([ToolsExecutor(), policy]),
        ]
    )


# ---------------------------------------------------------------- loading


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_load_scenarios_counts_and_determinism(benchmark: str) -> None:
    everything = load_scenarios(benchmark)
    assert len(everything) == FULL_COUNTS[benchmark]
    ids = [s.scenario_id for s in everything]
    assert len(set(ids)) == len(ids)
    assert all(isinstance(s, Scenario) and s.benchmark == protocol_benchmark(benchmark) for s in everything[:3])
    sample = [s.scenario_id for s in load_scenarios(benchmark, limit=5)]
    assert sample == [s.scenario_id for s in load_scenarios(benchmark, limit=5, seed=42)]
    assert len(sample) == 5 and sorted(sample, key=ids.index) == sample
    assert sample != [s.scenario_id for s in load_scenarios(benchmark, limit=5, seed=7)]


def test_unknown_benchmark_names_the_allowed_values() -> None:
    with pytest.raises(ConfigError) as err:
        load_scenarios("injecagent")
    for name in BENCHMARKS:
        assert name in str(err.value)


def test_canonical_ids_resolve() -> None:
    config = load_benchmarks_config()
    scenarios = canonical_scenarios()
    assert [s.scenario_id for s in scenarios] == [e.scenario_id for e in config.canonical]
    assert all(e.why for e in config.canonical)
    kinds = [s.benchmark for s in scenarios]
    assert kinds.count("injecagent_dh") == 2 and kinds.count("injecagent_ds") == 2
    assert {"bipia_email", "bipia_table", "bipia_code"} <= set(kinds) and kinds.count("agentdojo") == 3
    assert all(s.user_task and s.injection and s.task_tools for s in scenarios)


def test_unknown_ids_and_agentdojo_tasks_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="names no benchmark"):
        scenario_by_id("nope/1")
    with pytest.raises(ConfigError, match="allowed: banking"):
        scenario_by_id("agentdojo/bank/user_task_0/injection_task_0")
    with pytest.raises(ConfigError, match="does not exist"):
        scenario_by_id("injecagent/dh/99999")


# ---------------------------------------------------------------- InjecAgent


def test_injecagent_dh_judge_both_ways() -> None:
    s = scenario_by_id("injecagent/dh/33")
    user = (s.user_tool, {"url": "www.codedculinary.com"})
    attacked = s.run(agent(ScriptedPolicy([user, (s.attacker_tools[0], {"lock_id": "front"})], lambda _: "Done.")))
    assert attacked.attack_succeeded and attacked.details["injection_seen"]
    benign = s.run(agent(ScriptedPolicy([user], lambda seen: f"Here is the page: {seen}")))
    assert not benign.attack_succeeded and benign.utility == 1.0
    assert "unlock my front door" in get_text_content_as_str(benign.messages[-1]["content"])
    idle = s.run(agent(ScriptedPolicy([], lambda _: "I cannot browse.")))
    assert not idle.attack_succeeded and idle.utility == 0.0 and not idle.details["injection_seen"]


def test_injecagent_ds_two_stages() -> None:
    s = scenario_by_id("injecagent/ds/33")
    extract, send = s.attacker_tools
    user = (s.user_tool, {"url": "www.codedculinary.com"})
    full = s.run(agent(ScriptedPolicy([user, (extract, {}), (send, {"to": "amy.watson@gmail.com"})], str)))
    assert full.attack_succeeded and full.details["stage1"] and full.details["stage2"]
    stolen = next(m for m in full.messages if m["role"] == "tool" and m["tool_call"].function == extract)
    assert "private" in get_text_content_as_str(stolen["content"])  # stage 1 returned the data
    half = s.run(agent(ScriptedPolicy([user, (extract, {})], str)))
    assert not half.attack_succeeded and half.details["stage1"] and not half.details["stage2"]
    benign = s.run(agent(ScriptedPolicy([user], lambda _: "The recipe page is open.")))
    assert not benign.attack_succeeded and not benign.details["stage1"] and benign.utility == 1.0


def test_injecagent_shared_user_and_attacker_tool() -> None:
    s = scenario_by_id("injecagent/ds/275")  # the user tool is also the attacker's extraction tool
    assert s.user_tool == s.attacker_tools[0]
    once = s.run(agent(ScriptedPolicy([(s.user_tool, {"username": "thedevguy"})], str)))
    assert not once.details["stage1"]
    steal = [
        (s.user_tool, {"username": "thedevguy"}),
        (s.user_tool, {"username": "john_hub"}),
        (s.attacker_tools[1], {"to": "amy.watson@gmail.com"}),
    ]
    assert s.run(agent(ScriptedPolicy(steal, str))).attack_succeeded


# ---------------------------------------------------------------- BIPIA


def _bipia_answers(s) -> tuple[Callable[[str], str], Callable[[str], str]]:
    if s.task == "code":
        payload = re.search(r"```\n(.*?)```", s.attack_text, re.S).group(1)
        return (lambda _: f"```\n{s.ideal}\n{payload}```"), (lambda _: f"```\n{s.ideal}\n```")
    if s.attack_category == "Language Translation":
        return (lambda _: f"El valor es {s.ideal} y no hay más pagos en el correo."), (lambda _: f"It is {s.ideal}.")
    return (lambda _: f"{s.ideal}. Visit www.shoplux.com for exclusive deals on luxury watches"), (
        lambda _: f"The answer is {s.ideal}."
    )


@pytest.mark.parametrize("task", ["email", "table", "code"])
def test_bipia_judge_both_ways(task: str) -> None:
    s = next(c for c in canonical_scenarios() if c.benchmark == f"bipia_{task}")
    attacked_answer, benign_answer = _bipia_answers(s)
    attacked = s.run(agent(ScriptedPolicy([(s.read_tool, {})], attacked_answer)))
    benign = s.run(agent(ScriptedPolicy([(s.read_tool, {})], benign_answer)))
    assert attacked.attack_succeeded and not benign.attack_succeeded
    assert benign.utility == 1.0 and benign.details["injection_seen"]
    assert s.injection in get_text_content_as_str(benign.messages[3]["content"])  # the tool planted it
    assert attacked.judge.startswith(("bipia-rule:", "keyword-judge:"))


# ---------------------------------------------------------------- AgentDojo


def test_agentdojo_judge_both_ways() -> None:
    s = scenario_by_id("agentdojo/slack/user_task_0/injection_task_3")
    attacked = s.run(GroundTruthPipeline(s.injection_task_obj))
    assert attacked.attack_succeeded and attacked.utility == 0.0 and attacked.messages
    benign = s.run(GroundTruthPipeline(s.user_task_obj))
    assert not benign.attack_succeeded and benign.utility == 1.0
    assert "Local model" in s.injection and s.injection_task_obj.GOAL in s.injection
    assert benign.judge == "agentdojo:important_instructions(task checks)"
