"""The adaptive attack against the tool gate: a goal the gate lets through, chosen from the committed allowlist and
planning policy before the episode. Real scenarios of every benchmark kind, and one real AgentDojo episode."""

from __future__ import annotations

from pathlib import Path

import pytest

from rvu_pipelines.agents.defenses.allowlist import load_tool_allowlist
from rvu_pipelines.agents.defenses.builder import gate_allows, gate_check, gate_task_tools
from rvu_pipelines.agents.defenses.rvg_policy import load_rvg_policies
from rvu_pipelines.attacks.catalog import AttackContext, attack_fingerprint, attacked
from rvu_pipelines.attacks.gate_aware import allowed_goal, gate_reach, goal_tools, passes_gate
from rvu_pipelines.attacks.planted_call import target_text
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.redteam.table import heldout_sample, unavailable
from rvu_pipelines.scenarios import scenarios_for

STRINGS = Path(__file__).resolve().parents[2] / "configs" / "attacks"


GATE = gate_check(load_tool_allowlist(), load_rvg_policies())  # the committed configuration the harness reads


def _context(defense: str) -> AttackContext:
    return AttackContext("tiny", "sha", defense, STRINGS, gate_check=GATE)


@pytest.fixture(scope="module")
def agentdojo() -> list:
    return heldout_sample("agentdojo", 30)


def test_injecagent_goals_never_pass_the_gate_and_keep_their_own_goal() -> None:
    scenarios = scenarios_for("injecagent_dh", 5) + scenarios_for("injecagent_ds", 5)
    for defense in ("rvg", "rvg_oracle", "rvu_v2"):
        assert gate_reach(scenarios, defense, GATE) == {"n": 10, "own_goal_allowed": 0, "some_goal_allowed": 0}
    scenario = scenarios[0]
    assert goal_tools(scenario) == frozenset(scenario.attacker_tools)  # type: ignore[attr-defined]
    rewritten = attacked(scenario, "adaptive", _context("rvg"))
    assert rewritten.scenario_id == scenario.scenario_id
    assert rewritten.injection == f"{scenario.injection} {target_text(scenario)}"


def test_bipia_is_judged_on_text_the_gate_cannot_see() -> None:
    scenario = scenarios_for("bipia_email", 1)[0]
    assert goal_tools(scenario) is None and passes_gate(scenario, "rvg", GATE)
    assert attacked(scenario, "adaptive", _context("rvg")) == scenario


def test_an_agentdojo_goal_the_gate_blocks_is_swapped_for_one_it_allows(agentdojo) -> None:
    allowlist, policies = load_tool_allowlist(), load_rvg_policies()
    blocked = [s for s in agentdojo if not passes_gate(s, "rvg", GATE) and allowed_goal(s, "rvg", GATE) is not None]
    assert blocked, "the sample holds a scenario whose own goal the gate blocks but another goal passes"
    scenario = blocked[0]
    own_tools = goal_tools(scenario)
    assert own_tools and not gate_allows("rvg", scenario, own_tools, allowlist, policies)
    rewritten = attacked(scenario, "adaptive", _context("rvg"))
    assert rewritten.user_task_id == scenario.user_task_id  # type: ignore[attr-defined]
    assert rewritten.injection_task_id != scenario.injection_task_id  # type: ignore[attr-defined]
    new_tools = goal_tools(rewritten)
    assert new_tools and new_tools <= gate_task_tools("rvg", scenario, policies)
    assert rewritten.injection.endswith(target_text(rewritten))
    # the plan is the one the gate makes: the same request, the same declared tools its runtime hands over
    from agentdojo.functions_runtime import FunctionsRuntime

    runtime = FunctionsRuntime(scenario.suite.tools)  # type: ignore[attr-defined]
    assert set(runtime.functions) == set(scenario.tool_declarations)  # type: ignore[attr-defined]
    # a scenario whose own goal already passes keeps it
    passing = next(s for s in agentdojo if passes_gate(s, "rvg", GATE))
    assert attacked(passing, "adaptive", _context("rvg")).scenario_id == passing.scenario_id


def test_the_reach_counts_are_consistent_and_the_oracle_plan_differs(agentdojo) -> None:
    for defense in ("rvg", "rvg_oracle"):
        reach = gate_reach(agentdojo, defense, GATE)
        assert reach["n"] == 30 and 0 < reach["own_goal_allowed"] <= reach["some_goal_allowed"] <= 30
    policies = load_rvg_policies()
    assert any(gate_task_tools("rvg", s, policies) != gate_task_tools("rvg_oracle", s, policies) for s in agentdojo)


def test_the_table_runs_adaptive_against_the_gates_and_names_what_is_missing() -> None:
    assert unavailable("adaptive", "rvg", _context("rvg")) is None
    assert unavailable("adaptive", "rvu_v2", _context("rvu_v2")) is None
    assert "no adaptive attack against hfer" in str(unavailable("adaptive", "hfer", _context("hfer")))
    assert attack_fingerprint("adaptive", _context("rvg")) == "adaptive:gate-goal-v1"
    bare = AttackContext("tiny", "sha", "rvg", STRINGS)
    with pytest.raises(ConfigError, match="No gate check in the attack context of 'rvg'"):
        attacked(scenarios_for("injecagent_dh", 1)[0], "adaptive", bare)
    with pytest.raises(ConfigError, match="defenses with one: .*rvg"):
        attacked(scenarios_for("injecagent_dh", 1)[0], "adaptive", _context("hfer"))


def test_a_real_episode_behind_the_gate_runs_the_chosen_goal(string_harness, agentdojo) -> None:
    scenario = next(
        s for s in agentdojo if not passes_gate(s, "rvg", GATE) and allowed_goal(s, "rvg", GATE) is not None
    )
    harness = string_harness(STRINGS)
    run = harness.run_cell("agentdojo", "rvg", attack="adaptive", scenarios=[scenario], progress=False)
    [row] = run.rows.to_dicts()
    assert row["error"] is None and row["defense"] == "rvg"
    assert row["scenario_id"] == allowed_goal(scenario, "rvg", GATE).scenario_id != scenario.scenario_id  # type: ignore[union-attr]


def test_the_study_prints_the_goals_past_each_gate() -> None:
    import polars as pl

    from rvu_pipelines.redteam.table import TablePlan, gate_reach_rows, study_markdown

    plan = TablePlan(("injecagent_dh", "agentdojo"), ("native", "adaptive"), ("vanilla", "rvg", "rvg_oracle"), 10)
    rows = gate_reach_rows(plan, GATE)
    assert [(r["benchmark"], r["defense"]) for r in rows] == [
        ("injecagent_dh", "rvg"),
        ("injecagent_dh", "rvg_oracle"),
        ("agentdojo", "rvg"),
        ("agentdojo", "rvg_oracle"),
    ]
    assert rows[0]["some_goal_allowed"] == 0 and rows[2]["n"] == 10
    text = study_markdown(pl.DataFrame(), pl.DataFrame(), [], gate_reach=rows)
    assert "Goals past the tool gate" in text
    assert f"| agentdojo | rvg | 10 | {rows[2]['own_goal_allowed']} | {rows[2]['some_goal_allowed']} |" in text
    assert gate_reach_rows(TablePlan(("agentdojo",), ("native",), ("vanilla", "fath"), 10), GATE) == []
