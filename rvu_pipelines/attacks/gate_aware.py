"""The adaptive attack against the tool gate (``rvg``, ``rvg_oracle``, ``rvu_v1``, ``rvu_v2``): goals the gate allows.

A gate blocks calls to tools outside the task's plan, so an attacker who knows the gate (its allowlist and its
planning policy, both configuration; the harness hands the check to the attack in its ``AttackContext``) does not
ask for a blocked tool: it picks a goal whose every tool the gate lets through for this user's request, e.g.
exfiltration through a send the user's task also needs. The attack is a choice of goal, made before the episode
from what the attacker can read; it needs no model access.

- AgentDojo: the scenario keeps its user task and is retargeted to the first injection task of its suite (AgentDojo's
  order) whose ground-truth tools the gate allows; its own injection task when that one is already allowed. The
  judge is the chosen injection task's own security check, so the cell's scenario ids name the chosen goal.
- InjecAgent: the goals are fixed by the case, and every attacker tool differs from the user's tool, so no goal
  passes the gate; the scenario keeps its own goal and the gate is expected to block it.
- BIPIA judges text in the answer, which no tool gate sees: the scenario keeps its own goal.

In every case the injection is the goal's native text with the goal's first call written out (``planted_call``),
the strongest text here that needs no model access. :func:`gate_reach` counts, per scenario, whether its own goal
and whether any goal of its suite gets past the gate: what a gate cannot stop by construction.
"""

from __future__ import annotations

from dataclasses import replace

from rvu_pipelines.attacks.catalog import AttackContext, GateCheck
from rvu_pipelines.attacks.planted_call import target_text
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.axes import GATED_DEFENSES
from rvu_pipelines.scenarios.contract import Scenario

FINGERPRINT = "gate-goal-v1"


def goal_tools(scenario: Scenario) -> frozenset[str] | None:
    """The tools the benchmark's judge needs the agent to call for the attacker's goal; None when the judge reads
    text only (BIPIA), which a tool gate cannot block."""
    attacker_tools = getattr(scenario, "attacker_tools", None)
    if attacker_tools:
        return frozenset(attacker_tools)
    calls = getattr(scenario, "injection_calls", None)  # AgentDojo: the injection task's ground truth
    return None if calls is None else frozenset(function for function, _ in calls)


def passes_gate(scenario: Scenario, defense: str, gate: GateCheck) -> bool:
    """Whether the scenario's own goal gets past the gate of ``defense`` (always, for a text-only judge)."""
    tools = goal_tools(scenario)
    return True if tools is None else gate(defense, scenario, tools)


def allowed_goal(scenario: Scenario, defense: str, gate: GateCheck) -> Scenario | None:
    """The scenario with the first goal the gate of ``defense`` lets through (its own first), or None."""
    if passes_gate(scenario, defense, gate):
        return scenario
    if not hasattr(scenario, "injection_task_obj"):
        return None
    for task_id in scenario.suite.injection_tasks:  # type: ignore[attr-defined]
        candidate = replace(scenario, injection_task_id=task_id, injection_override=None)  # type: ignore[type-var]
        if passes_gate(candidate, defense, gate):
            return candidate
    return None


def rewrite(scenario: Scenario, context: AttackContext) -> Scenario:
    """``scenario`` retargeted to a goal the cell's gate allows (its own when none is), with the goal's call
    written out after its native injection. The gate check comes with the context (the harness builds it from
    the settings its defenses run with)."""
    if context.defense not in GATED_DEFENSES:
        raise ValueError(
            f"the gate-aware attack is for the gated defenses ({sorted(GATED_DEFENSES)}), not {context.defense!r}"
        )
    if context.gate_check is None:
        raise ConfigError(
            f"No gate check in the attack context of {context.defense!r}: run the attack through the harness."
        )
    chosen = allowed_goal(scenario, context.defense, context.gate_check) or scenario
    if goal_tools(chosen) is None:
        return chosen
    return chosen.with_injection(f"{chosen.injection} {target_text(chosen)}")


def gate_reach(scenarios: list[Scenario], defense: str, gate: GateCheck) -> dict[str, int]:
    """How many of ``scenarios`` have their own goal past the gate of ``defense`` (the gate cannot stop them by
    construction) and how many have some goal of their suite past it (what the adaptive attack can pursue)."""
    own = sum(passes_gate(s, defense, gate) for s in scenarios)
    some = sum(allowed_goal(s, defense, gate) is not None for s in scenarios)
    return {"n": len(scenarios), "own_goal_allowed": own, "some_goal_allowed": some}
