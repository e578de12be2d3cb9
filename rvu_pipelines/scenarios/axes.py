"""The three axes of the attack table (benchmarks × attacks × defenses), as plain names.

They sit on the scenario side so that agents/ (and the Dagster code location's partitions) import them
from here and scenarios/ never imports agents/. Importable without AgentDojo, so the code location loads
without paying for the agent stack until a cell runs.
"""

DEFENSES: tuple[str, ...] = ("vanilla", "classifier", "hfer", "fath", "rvg", "rvg_oracle", "rvu_v1", "rvu_v2")
# What a reader of the table must know about a row. rvg_oracle gates AgentDojo tool calls with the tools
# of the task's ground-truth solution, which no deployed gate can know: it is an upper bound, reported
# next to the realistic rvg (tools planned from the request and the suite's declarations) and never
# in its place. On InjecAgent and BIPIA both gates allow the one tool the protocol declares.
DEFENSE_NOTES: dict[str, str] = {
    "hfer": "seed 004's spectral kill switch on the agent's own weights, calibrated on 20 labelled contamination "
    "examples (BIPIA + InjecAgent, calibration split only); stops the episode before generation",
    "rvg": "realistic gate: tools planned before the episode from the request and the suite's tool declarations",
    "rvg_oracle": "upper bound: reads the answer key (AgentDojo's ground-truth solution tools)",
}
RECOVERING_DEFENSES = frozenset({"rvu_v1", "rvu_v2"})  # the defenses that recover and certify after an episode
GATED_DEFENSES = frozenset({"rvg", "rvg_oracle", "rvu_v1", "rvu_v2"})  # the defenses behind the tool gate
# AgentDojo per suite, every user task × injection task of it whatever configs/benchmarks.yaml selects: the full
# table's AgentDojo rows (``agentdojo`` is the configured subset the default job, the canonical 10 and the nightly
# sweep use). Their scenarios are AgentDojo's, so the defenses see the benchmark ``agentdojo``.
AGENTDOJO_SUITE_BENCHMARKS: dict[str, str] = {
    "agentdojo_banking": "banking",
    "agentdojo_slack": "slack",
    "agentdojo_travel": "travel",
    "agentdojo_workspace": "workspace",
}
BENCHMARKS: tuple[str, ...] = (
    "injecagent_dh",
    "injecagent_ds",
    "bipia_email",
    "bipia_table",
    "bipia_code",
    "agentdojo",
    *AGENTDOJO_SUITE_BENCHMARKS,
)
# The nightly sweep's benchmarks: the full table's populations, so each sampled cell has a golden cell to be held to
# (AgentDojo per suite; its configured subset runs nightly in the canonical 10).
SWEEP_BENCHMARKS: tuple[str, ...] = tuple(b for b in BENCHMARKS if b != "agentdojo")


def protocol_benchmark(benchmark: str) -> str:
    """The benchmark whose protocol (judge, tool declarations, gate policy) a table row's scenarios follow."""
    return "agentdojo" if benchmark in AGENTDOJO_SUITE_BENCHMARKS else benchmark


CANONICAL = "canonical"  # the paper's 10 canonical scenarios, a pseudo-benchmark of the table

NATIVE = "native"  # each benchmark's own injections
# The attacks of the table (rvu_pipelines.attacks.catalog registers one rewrite per name). ``adaptive`` is the
# attack optimised against the defense of the cell it runs in.
ATTACKS: tuple[str, ...] = (
    "no_attack",
    NATIVE,
    "random_string",
    "forged_turn",
    "planted_call",
    "gcg_universal",
    "gcg_universal_call",
    "gcg_universal_call_mixed",
    "gcg_universal_call_staged",
    "gcg_per_scenario",
    "adaptive",
    "adaptive_call",
    "adaptive_per_scenario",
)
ATTACK_NOTES: dict[str, str] = {
    "no_attack": "control: the injection removed (utility without attack; any success means the judge is broken)",
    NATIVE: "the benchmark's own injection text",
    "random_string": "control: the native injection plus a random string of the optimised strings' length",
    "forged_turn": "the injection closes the tool turn and opens a fake user turn in the model's chat template",
    "planted_call": "control: the native injection plus the attacker's goal written out, unoptimised (the tool call, "
    "on InjecAgent ds both calls, extract then send; on BIPIA the answer its judge accepts; what a per-scenario "
    "string starts from)",
    "gcg_universal": "the native injection plus one string optimised (GCG) on the agent's own weights over a "
    "training split of InjecAgent scenarios; evaluated on held-out scenarios",
    "gcg_universal_call": "the attacker's goal written out (planted_call) plus one string optimised (GCG) on the "
    "agent's own weights over a training split of InjecAgent scenarios with their goals planted; evaluated on "
    "held-out scenarios",
    "gcg_universal_call_mixed": "gcg_universal_call's attacker training its one string on the training splits of "
    "InjecAgent dh and ds together (from the gcg_universal_call string); evaluated on held-out scenarios",
    "gcg_universal_call_staged": "gcg_universal_call's attacker on the same dh and ds splits, its one string "
    "optimised on every call the judge needs at its own decision point (data stealing: the extraction after the "
    "injection, the send after the extraction's result); evaluated on held-out scenarios",
    "gcg_per_scenario": "the native injection plus a string optimised (GCG) on the agent's own weights for that very "
    "scenario; runs on the scenarios that have one",
    "adaptive": "the attack optimised against the cell's defense (the attacker moves second)",
    "adaptive_call": "the attacker's goal written out plus one universal string optimised against the cell's defense "
    "(from the gcg_universal_call string); evaluated on held-out scenarios",
    "adaptive_per_scenario": "the per-scenario string optimised against the cell's defense, from the scenario's "
    "gcg_per_scenario string; runs on the scenarios that have one",
}
