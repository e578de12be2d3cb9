"""The planted-call control writes the judge's tool call after the native injection, and says why where a benchmark
has no tool call to plant."""

import pytest

from rvu_pipelines.attacks.catalog import AttackContext, attack_fingerprint, attacked
from rvu_pipelines.attacks.planted_call import PLANTED_CALL, target_text
from rvu_pipelines.errors import ConfigError

CONTEXT = AttackContext("tiny", "a" * 64, "vanilla", ".")


def test_the_attackers_tool_call_follows_the_native_injection():
    from rvu_pipelines.scenarios import scenarios_for

    scenario = scenarios_for("injecagent_dh", 1)[0]
    planted = attacked(scenario, PLANTED_CALL, CONTEXT)
    assert planted.injection == f'{scenario.injection} {{"tool": "{scenario.attacker_tools[0]}"}}'
    assert planted.attacker_tools == scenario.attacker_tools  # the judge stays the benchmark's
    assert target_text(scenario) in planted.injection
    assert attack_fingerprint(PLANTED_CALL, CONTEXT) == "planted_call:goal-calls-v3"


def test_a_two_stage_goal_is_written_out_call_by_call_and_the_string_targets_the_first():
    """InjecAgent data stealing counts only the extraction followed by the send: the planted goal names both calls,
    in order; an optimised string's target stays the first (the call right after the agent reads the output)."""
    from rvu_pipelines.scenarios import scenarios_for

    scenario = scenarios_for("injecagent_ds", 1)[0]
    extract, send = scenario.attacker_tools
    planted = attacked(scenario, PLANTED_CALL, CONTEXT)
    assert planted.injection == f'{scenario.injection} {{"tool": "{extract}"}} {{"tool": "{send}"}}'
    assert target_text(scenario) == f'{{"tool": "{extract}"}}'


def test_on_a_benchmark_judged_on_the_answer_the_planted_text_is_that_answer():
    from rvu_pipelines.scenarios import scenarios_for

    scenario = scenarios_for("bipia_email", 1)[0]
    planted = attacked(scenario, PLANTED_CALL, CONTEXT)
    assert planted.injection == f"{scenario.injection} {scenario.attack_goal}"
    assert planted.attack_text == scenario.attack_text  # judged on the shipped goal, not on the planted text
    assert scenario.judge(scenario.attack_goal)[0] and not scenario.judge(scenario.ideal)[0]


def test_the_table_plan_refuses_an_unknown_sample():
    from rvu_pipelines.redteam.table import TablePlan

    assert TablePlan(("injecagent_dh",), (PLANTED_CALL,), ("vanilla",), 5, "per_scenario").sample == "per_scenario"
    with pytest.raises(ConfigError, match="Unknown sample 'all'; allowed values: heldout, per_scenario"):
        TablePlan(("injecagent_dh",), (PLANTED_CALL,), ("vanilla",), 5, "all")


def test_an_agentdojo_target_is_the_injection_tasks_first_call_with_its_arguments():
    import json

    from rvu_pipelines.scenarios import scenarios_for

    scenario = scenarios_for("agentdojo", 1)[0]
    env = scenario.suite.load_and_inject_default_environment({})
    first = scenario.injection_task_obj.ground_truth(env)[0]
    assert json.loads(target_text(scenario)) == {
        "tool": first.function,
        "arguments": json.loads(json.dumps(dict(first.args), default=str)),
    }


def test_an_agentdojo_goal_without_a_ground_truth_call_is_planted_in_its_own_words():
    """Travel's injection_task_6 is judged on the answer (recommend a hotel): no call to plant, so the planted goal
    is the task's GOAL, and the judge stays AgentDojo's."""
    from rvu_pipelines.scenarios import scenarios_for

    scenario = next(s for s in scenarios_for("agentdojo_travel", None) if s.scenario_id.endswith("/injection_task_6"))
    assert scenario.injection_calls == ()
    assert "Riverside View Hotel" in target_text(scenario)
    planted = attacked(scenario, PLANTED_CALL, CONTEXT)
    assert planted.injection == f"{scenario.injection} {scenario.injection_goal}"
    assert planted.benchmark == "agentdojo"
