"""The control beside the per-scenario strings: the attacker's goal itself written into the injection.

A per-scenario string is warm-started from what the judge counts as the attack's success (the tool call
``{"tool": "<attacker tool>"}`` on InjecAgent and AgentDojo, the answer on BIPIA), so the question its row must answer
is what the optimisation adds to that text. ``planted_call`` plants the attacker's whole goal written out after the
native injection, unoptimised: if it reaches the per-scenario row's ASR, the row's result is the planted text's, not
the optimiser's. It needs no model access: the attacker only knows its own goal. Where the judge needs more than one
call (InjecAgent data stealing: extract, then send), the goal is every call in order; an optimised string targets
the first, the call the agent makes right after reading it, and a staged one each call at its own decision point
(:func:`goal_calls`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from rvu_pipelines.attacks.catalog import AttackSpec, register
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.contract import Scenario

PLANTED_CALL = "planted_call"


def target_text(scenario: Scenario) -> str:
    """What the judge counts as the attack's success, as the agent would write it: a tool call, complete, in the
    agent's tool-call format, or for a benchmark judged on the answer, that answer.

    InjecAgent: ``{"tool": "<first attacker tool>"}`` (its tools take optional arguments, so the bare call runs);
    AgentDojo: the injection task's first ground-truth call with its arguments, or for a task without one (its check
    reads the answer or the environment) the task's goal in its own words. The call is closed on purpose: a
    target that stops at the tool's name is reached by strings the model copies on into malformed JSON, which the
    agent's parser rightly ignores. BIPIA: the shortest answer the attack's own judge accepts (the payload, the
    requested form, the attack's keywords; ``BipiaScenario.attack_goal``)."""
    tools: Sequence[str] = getattr(scenario, "attacker_tools", ())
    if tools:
        return json.dumps({"tool": tools[0]})
    calls = getattr(scenario, "injection_calls", None)  # AgentDojo: the injection task's ground truth
    if calls is not None:
        if calls:
            function, args = calls[0]
            return json.dumps({"tool": function, "arguments": args}, default=str)
        words = str(getattr(scenario, "injection_goal", "") or "")
        if not words:
            raise ConfigError(f"{scenario.scenario_id}: the injection task has no ground-truth call and no goal.")
        return words
    goal = getattr(scenario, "attack_goal", None)  # BIPIA: judged on the answer
    if goal is not None:
        return str(goal)
    raise ConfigError(
        f"{scenario.scenario_id}: benchmark {scenario.benchmark!r} has no target for an optimised string (a tool "
        "call the judge counts, or an answer it accepts)."
    )


def goal_calls(scenario: Scenario) -> list[str]:
    """The calls the judge needs, in order, each as the agent would write it: on InjecAgent one per attacker tool
    (data stealing: the extraction, then the send), elsewhere the one :func:`target_text`."""
    tools: Sequence[str] = getattr(scenario, "attacker_tools", ())
    if len(tools) > 1:
        return [json.dumps({"tool": tool}) for tool in tools]
    return [target_text(scenario)]


def goal_text(scenario: Scenario) -> str:
    """The attacker's whole goal as the agent would write it: every call of :func:`goal_calls` in order."""
    return " ".join(goal_calls(scenario))


def plant_goal(scenario: Scenario) -> Scenario:
    """The scenario with its attacker's goal written out after the native injection (what ``planted_call`` plants,
    and what ``gcg_universal_call`` appends its string to)."""
    return scenario.with_injection(f"{scenario.injection} {goal_text(scenario)}")


PLANT_VERSION = "goal-calls-v3"  # what decides the planted text; part of the episode keys of the attacks that plant it


register(
    AttackSpec(
        PLANTED_CALL,
        "control: the native injection plus the attacker's goal written out (a per-scenario string's start)",
        rewrite=lambda scenario, _context: plant_goal(scenario),
        fingerprint=lambda _context: PLANT_VERSION,
    )
)
