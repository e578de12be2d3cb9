"""The control beside the per-scenario strings: the attacker's tool call itself written into the injection.

A per-scenario string is warm-started from the tool call the judge counts (``{"tool": "<attacker tool>"}``), so the
question its row must answer is what the optimisation adds to that text. ``planted_call`` plants exactly that text
after the native injection, unoptimised: if it reaches the per-scenario row's ASR, the row's result is the planted
text's, not the optimiser's. It needs no model access: the attacker only knows its own goal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from rvu_pipelines.attacks.catalog import AttackSpec, register
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.contract import Scenario

PLANTED_CALL = "planted_call"


def target_text(scenario: Scenario) -> str:
    """The tool call the judge counts as the attack's success, complete, in the agent's tool-call format.

    InjecAgent: ``{"tool": "<first attacker tool>"}`` (its tools take optional arguments, so the bare call runs);
    AgentDojo: the injection task's first ground-truth call with its arguments. The call is closed on purpose: a
    target that stops at the tool's name is reached by strings the model copies on into malformed JSON, which the
    agent's parser rightly ignores."""
    tools: Sequence[str] = getattr(scenario, "attacker_tools", ())
    if tools:
        return json.dumps({"tool": tools[0]})
    calls = getattr(scenario, "injection_calls", None)  # AgentDojo: the injection task's ground truth
    if calls is not None:
        if not calls:
            raise ConfigError(f"{scenario.scenario_id}: the injection task has no ground-truth call to target.")
        function, args = calls[0]
        return json.dumps({"tool": function, "arguments": args}, default=str)
    raise ConfigError(
        f"{scenario.scenario_id}: benchmark {scenario.benchmark!r} has no tool-call target for an optimised "
        "string (InjecAgent and AgentDojo have; BIPIA judges free text)."
    )


register(
    AttackSpec(
        PLANTED_CALL,
        "control: the native injection plus the attacker's tool call written out (a per-scenario string's start)",
        rewrite=lambda scenario, _context: scenario.with_injection(f"{scenario.injection} {target_text(scenario)}"),
        fingerprint=lambda _context: "tool-call-v2",
    )
)
