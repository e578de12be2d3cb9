"""Attacks with strings optimised on the agent's own weights: the universal string and the adaptive ones.

``gcg_universal`` appends one string, optimised with GCG over a training split of InjecAgent scenarios on the
de-quantised copy of the agent's GGUF, to every scenario's native injection. ``gcg_universal_call`` is the same
attacker who also writes its own goal out (the ``planted_call`` text: the attacker knows which call it wants) and
appends one universal string, optimised over the training split with the goal planted, after it: its control is
``planted_call`` on the same scenarios, so its row says what the one optimised string adds to the planted goal.
``gcg_universal_call_mixed`` is that attacker training on the splits of both InjecAgent benchmarks (dh and ds),
starting from the ``gcg_universal_call`` string. ``gcg_universal_call_staged`` trains on the same splits but targets
every call the judge needs at its own decision point: on data stealing the extraction right after the injection is
read, and the send once the extraction's result has come back (the injection and the string still in the prompt).

``gcg_per_scenario`` appends a string optimised on the very scenario it is planted in (a stronger attacker: it knows
the user's request and the agent's prompt up to the injection; only the scenarios with a stored string can run it).
``adaptive`` appends the string optimised against the defense of the cell it runs in (the attacker moves second):

- ``vanilla``: nothing to adapt to; the universal string;
- ``classifier``: a joint objective, the attacker's tool call plus a low score of the classifier's own detector
  on the planted text. The production detector is an int8 ONNX graph, so its term is scored black-box on every
  candidate string, not differentiated;
- ``fath``: optimised on prompts captured through FATH's own pipeline with a fresh random tag per prompt, so the
  string works in expectation over tags it cannot see.

Against the tool gate (``rvg``, ``rvg_oracle``, ``rvu_*``) ``adaptive`` is a choice of goal the gate allows, not a
string (:mod:`rvu_pipelines.attacks.gate_aware`). ``hfer`` has no universal adaptive string; asking for one says so.

``adaptive_call`` is the planted-goal attacker of ``gcg_universal_call`` moving second: against ``classifier`` one
universal string, from the ``gcg_universal_call`` string, optimised over the same training split with the
classifier's detector score of the text it reads in the objective (black-box); against ``vanilla`` the
``gcg_universal_call`` string itself. Its control is that string (what knowing the defense adds).

``adaptive_per_scenario`` is the per-scenario attacker adapted to the cell's defense: against ``vanilla`` its own
``gcg_per_scenario`` string, against ``classifier`` and ``hfer`` a string for the same scenario that starts from that
one and minimises the attacker's tool call plus the defense's own score of the text its detector reads (captured
through the defense's pipeline; the classifier's detector and the switch are scored black-box on every candidate),
and counts as solved only when the score is under the defense's threshold too.

Training scenarios are drawn from a fixed hash split of each benchmark that excludes the canonical 10, and
:func:`in_training_split` lets every evaluation leave them out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rvu_pipelines.attacks import gate_aware
from rvu_pipelines.attacks.catalog import AttackContext, AttackSpec, register
from rvu_pipelines.attacks.planted_call import PLANT_VERSION, goal_calls, plant_goal
from rvu_pipelines.attacks.stored import StoredString, load_string, string_path
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.axes import GATED_DEFENSES
from rvu_pipelines.scenarios.contract import Scenario

UNIVERSAL = "gcg_universal"
UNIVERSAL_CALL = "gcg_universal_call"  # the universal string appended to the planted goal
UNIVERSAL_CALL_MIXED = "gcg_universal_call_mixed"  # the same, trained on InjecAgent dh and ds together
UNIVERSAL_CALL_STAGED = "gcg_universal_call_staged"  # the same splits, every call of the goal at its decision point
PER_SCENARIO = "gcg_per_scenario"
RANDOM = "random_string"  # the unoptimised control: random plantable tokens, as many as the universal string's
ADAPTIVE = "adaptive"
ADAPTIVE_PER_SCENARIO = "adaptive_per_scenario"
ADAPTIVE_CALL = "adaptive_call"
ADAPTIVE_CLASSIFIER_CALL = "adaptive-classifier_call"
TRAIN_BENCHMARK = "injecagent_dh"
# the benchmarks whose training splits a universal string trains on (``TRAIN_BENCHMARK`` unless named here)
TRAIN_BENCHMARKS: dict[str, tuple[str, ...]] = {
    UNIVERSAL_CALL_MIXED: ("injecagent_dh", "injecagent_ds"),
    UNIVERSAL_CALL_STAGED: ("injecagent_dh", "injecagent_ds"),
}
# strings optimised at every decision point of a goal that needs several calls, not only at the first
STAGED_STRINGS = frozenset({UNIVERSAL_CALL_STAGED})
TRAIN_SPLIT_MODULUS = 20  # one scenario id in 20 (by sha256) may be used to train strings; never evaluated
# the string each defense faces under ``adaptive``; the objective and capture pipeline of each are in OBJECTIVES
ADAPTIVE_STRINGS: dict[str, str] = {"vanilla": UNIVERSAL, "classifier": "adaptive-classifier", "fath": "adaptive-fath"}
# the per-scenario string each defense faces under ``adaptive_per_scenario`` (one stored file per scenario)
ADAPTIVE_PER_SCENARIO_STRINGS: dict[str, str] = {
    "vanilla": PER_SCENARIO,
    "classifier": "adaptive-classifier_per_scenario",
    "hfer": "adaptive-hfer_per_scenario",
}
# the universal string on the planted goal each defense faces under ``adaptive_call``
ADAPTIVE_CALL_STRINGS: dict[str, str] = {"vanilla": UNIVERSAL_CALL, "classifier": ADAPTIVE_CLASSIFIER_CALL}
PER_SCENARIO_STRINGS = frozenset(ADAPTIVE_PER_SCENARIO_STRINGS.values())  # strings made for one scenario each
# strings optimised and planted after the attacker's goal
PLANTED_GOAL_STRINGS = frozenset({*ADAPTIVE_CALL_STRINGS.values(), UNIVERSAL_CALL_MIXED, UNIVERSAL_CALL_STAGED})
# a universal string adapted to a defense starts from the string it adapts (the attacker's best one without the
# defense), as the per-scenario adapted strings start from their scenario's own
# (and the string trained on more benchmarks starts from the one trained on fewer)
WARM_STARTS: dict[str, str] = {
    ADAPTIVE_CLASSIFIER_CALL: UNIVERSAL_CALL,
    UNIVERSAL_CALL_MIXED: UNIVERSAL_CALL,
    UNIVERSAL_CALL_STAGED: UNIVERSAL_CALL,
}
# the defenses whose detector scores the text a string is planted in: their score is the joint objective's penalty
DETECTOR_DEFENSES = frozenset({"classifier", "hfer"})
OBJECTIVES: dict[str, tuple[str, str]] = {  # string name -> (capture defense, objective in words)
    UNIVERSAL: ("vanilla", "mean cross-entropy of the attacker's tool call over the training prompts"),
    UNIVERSAL_CALL: (
        "vanilla",
        "mean cross-entropy of the attacker's tool call over the training prompts, the call written out before "
        "the string",
    ),
    UNIVERSAL_CALL_MIXED: (
        "vanilla",
        "mean cross-entropy of the attacker's first tool call over training prompts of InjecAgent dh and ds, the "
        "goal written out before the string, from the gcg_universal_call string",
    ),
    UNIVERSAL_CALL_STAGED: (
        "vanilla",
        "mean cross-entropy, over training prompts of InjecAgent dh and ds, of each call the judge needs at its own "
        "decision point (data stealing: the extraction after the injection, the send after the extraction's "
        "result), the goal written out before the string, from the gcg_universal_call string",
    ),
    PER_SCENARIO: ("vanilla", "cross-entropy of the attacker's tool call in the one scenario the string is planted in"),
    "adaptive-classifier": (
        "classifier",
        "the attacker's tool call plus the classifier defense's detector score of the tool outputs it reads "
        "(black-box)",
    ),
    "adaptive-fath": ("fath", "the attacker's tool call through FATH's pipeline, a fresh random tag per prompt"),
    ADAPTIVE_CLASSIFIER_CALL: (
        "classifier",
        "mean cross-entropy of the attacker's tool call over the training prompts, the call written out before "
        "the string, plus the classifier defense's detector score of the tool outputs it reads (black-box), from "
        "the gcg_universal_call string",
    ),
    "adaptive-classifier_per_scenario": (
        "classifier",
        "the attacker's tool call in the one scenario plus the classifier's detector score of the tool output it "
        "reads (black-box), from the scenario's gcg_per_scenario string; solved only under the detector's threshold",
    ),
    "adaptive-hfer_per_scenario": (
        "hfer",
        "the attacker's tool call in the one scenario plus the hfer switch's score of the text it reads (black-box), "
        "from the scenario's gcg_per_scenario string; solved only under the switch's threshold",
    ),
}


def in_training_split(scenario_id: str) -> bool:
    """Whether ``scenario_id`` falls in the fixed split optimised strings may be trained on."""
    digest = hashlib.sha256(f"attack-train/{scenario_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % TRAIN_SPLIT_MODULUS == 0


def training_scenarios(scenarios: Sequence[Scenario], n: int, exclude: frozenset[str] = frozenset()) -> list[Scenario]:
    """``n`` scenarios of the training split (by id), one per attacker goal where there are enough, leaving out
    ``exclude`` (the canonical 10): a universal string must carry over between goals, not learn one goal."""
    pool = sorted(
        (s for s in scenarios if in_training_split(s.scenario_id) and s.scenario_id not in exclude),
        key=lambda s: s.scenario_id,
    )
    if len(pool) < n:
        raise ConfigError(f"Only {len(pool)} scenarios in the training split, {n} asked for.")
    chosen: list[Scenario] = []
    goals: set[object] = set()
    for scenario in pool:  # first pass: a new attacker goal each; second: fill up in id order
        goal = tuple(getattr(scenario, "attacker_tools", ())) or scenario.injection
        if goal not in goals:
            goals.add(goal)
            chosen.append(scenario)
    chosen += [s for s in pool if s not in chosen]
    return chosen[:n]


def universal_training_scenarios(name: str, n: int, exclude: frozenset[str] = frozenset()) -> list[Scenario]:
    """The training scenarios of the universal string ``name``: ``n`` from the training split of each benchmark
    it trains on (``TRAIN_BENCHMARKS``), benchmark by benchmark."""
    from rvu_pipelines.scenarios import scenarios_for

    benchmarks = TRAIN_BENCHMARKS.get(name, (TRAIN_BENCHMARK,))
    return [s for b in benchmarks for s in training_scenarios(scenarios_for(b, None), n, exclude=exclude)]


def decision_stages(name: str, scenario: Scenario) -> list[tuple[tuple[str, ...], str | None]]:
    """``(answers, target)`` of each decision point the string ``name`` is optimised at in ``scenario``: the
    first call's alone (target None: the judge's first call), or for a staged string every call of the goal, each
    after the calls before it (``answers``)."""
    if name not in STAGED_STRINGS:
        return [((), None)]
    calls = goal_calls(scenario)
    return [(tuple(calls[:i]), call) for i, call in enumerate(calls)]


def _stored(name: str, context: AttackContext) -> StoredString:
    return load_string(string_path(context.strings_dir, name, context.profile), context.model_sha256)


def adaptive_name(defense: str) -> str:
    """The stored string the ``adaptive`` attack uses against ``defense``."""
    if defense in GATED_DEFENSES:
        raise ConfigError(f"The adaptive attack against {defense!r} chooses a goal the gate allows; it has no string.")
    if defense not in ADAPTIVE_STRINGS:
        raise ConfigError(
            f"No adaptive attack against defense {defense!r} yet; the defenses with one: "
            f"{', '.join(sorted(ADAPTIVE_STRINGS | dict.fromkeys(GATED_DEFENSES)))}. Run the cell with attack "
            "gcg_universal or native instead."
        )
    return ADAPTIVE_STRINGS[defense]


def _adapted_string(attack: str, strings: Mapping[str, str], defense: str) -> str:
    """The string ``attack`` plants against ``defense`` (``strings``: by defense), refused for a defense it has
    none against."""
    if defense not in strings:
        raise ConfigError(
            f"No {attack} string against defense {defense!r}; the defenses with one: {', '.join(sorted(strings))} "
            "(against the tool gate, attack adaptive chooses a goal the gate allows)."
        )
    return strings[defense]


def adaptive_call_name(defense: str) -> str:
    """The universal string on the planted goal that ``adaptive_call`` appends against ``defense``."""
    return _adapted_string(ADAPTIVE_CALL, ADAPTIVE_CALL_STRINGS, defense)


def append_string(scenario: Scenario, stored: StoredString) -> Scenario:
    """The injection the string was optimised after (the native one, or with the goal planted for the strings that
    follow it) with the optimised string right after it, where it was optimised to act."""
    if stored.train_scenarios and scenario.scenario_id in stored.train_scenarios:
        raise ConfigError(
            f"{scenario.scenario_id} trained the string {stored.name!r}; evaluate on held-out scenarios "
            "(leave out the training split, in_training_split())."
        )
    planted = slot_scenario(stored.name, scenario)
    return planted.with_injection(planted.injection + stored.text)


def plant_of(name: str) -> str:
    """How the attacker's goal is written out before the string ``name`` ("" for a string that follows the native
    injection): part of what decides the text the string is planted in."""
    return PLANT_VERSION if name in PLANTED_GOAL_STRINGS else ""


def slot_scenario(name: str, scenario: Scenario) -> Scenario:
    """The scenario as the string ``name`` meets it before the string: the goal planted for the strings that
    follow it, else the scenario itself (the optimiser captures its slot from this; the attack plants into it)."""
    return plant_goal(scenario) if name in PLANTED_GOAL_STRINGS else scenario


def per_scenario_dir(strings_dir: Path, profile: str, name: str = PER_SCENARIO) -> Path:
    """The folder of the per-scenario strings ``name`` of ``profile``: one stored string per scenario."""
    return Path(strings_dir) / f"{name}_{profile}"


def per_scenario_path(strings_dir: Path, profile: str, scenario_id: str, name: str = PER_SCENARIO) -> Path:
    return per_scenario_dir(strings_dir, profile, name) / (scenario_id.replace("/", "__") + ".json")


def per_scenario_strings(context: AttackContext, name: str = PER_SCENARIO) -> dict[str, StoredString]:
    """Every per-scenario string ``name`` stored for the context's profile, by scenario id (refused for other
    weights)."""
    folder = per_scenario_dir(context.strings_dir, context.profile, name)
    stored = [load_string(path, context.model_sha256) for path in sorted(folder.glob("*.json"))]
    return {s.train_scenarios[0]: s for s in stored if len(s.train_scenarios) == 1}


def adaptive_per_scenario_name(defense: str) -> str:
    """The per-scenario strings ``adaptive_per_scenario`` plants against ``defense``."""
    return _adapted_string(ADAPTIVE_PER_SCENARIO, ADAPTIVE_PER_SCENARIO_STRINGS, defense)


def own_string(scenario: Scenario, context: AttackContext, name: str = PER_SCENARIO) -> StoredString:
    """The per-scenario string ``name`` optimised on this very scenario (refused when there is none)."""
    path = per_scenario_path(context.strings_dir, context.profile, scenario.scenario_id, name)
    if not path.is_file():
        raise ConfigError(
            f"No {name} string for {scenario.scenario_id} at {path}: a per-scenario attack runs only on the "
            f"scenarios it was optimised for (scripts/optimise_attack.py --name {name})."
        )
    stored = load_string(path, context.model_sha256)
    if stored.train_scenarios != (scenario.scenario_id,):
        raise ConfigError(
            f"{path}: optimised on {list(stored.train_scenarios)}, not on {scenario.scenario_id}; regenerate it."
        )
    return stored


def append_own_string(scenario: Scenario, context: AttackContext, name: str = PER_SCENARIO) -> Scenario:
    """The native injection with the string ``name`` optimised on this very scenario right after it."""
    return scenario.with_injection(scenario.injection + own_string(scenario, context, name).text)


def _per_scenario_fingerprint(context: AttackContext, name: str = PER_SCENARIO) -> str:
    strings = per_scenario_strings(context, name)
    payload = "\n".join(f"{sid}/{s.model_sha256}/{s.text}" for sid, s in sorted(strings.items()))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _fingerprint(name: str, context: AttackContext) -> str:
    stored = _stored(name, context)
    digest = hashlib.sha256(f"{stored.model_sha256}/{stored.text}".encode()).hexdigest()[:16]
    return f"{plant_of(name)}/{digest}" if plant_of(name) else digest


def _string_attack(name: str, description: str, string_name: Callable[[AttackContext], str]) -> AttackSpec:
    """An attack that appends the stored string ``string_name(context)`` to the native injection."""
    return register(
        AttackSpec(
            name,
            description,
            rewrite=lambda scenario, context: append_string(scenario, _stored(string_name(context), context)),
            fingerprint=lambda context: _fingerprint(string_name(context), context),
        )
    )


_string_attack(
    UNIVERSAL,
    "the native injection plus one GCG string optimised on the agent's weights over training scenarios",
    lambda _context: UNIVERSAL,
)
_string_attack(
    UNIVERSAL_CALL,
    "the attacker's goal written out (planted_call) plus one GCG string optimised on the agent's weights over "
    "training scenarios with their goals planted",
    lambda _context: UNIVERSAL_CALL,
)
register(
    AttackSpec(
        PER_SCENARIO,
        "the native injection plus a GCG string optimised on the agent's weights for that very scenario",
        rewrite=append_own_string,
        fingerprint=_per_scenario_fingerprint,
    )
)
_string_attack(
    UNIVERSAL_CALL_MIXED,
    "the attacker's goal written out plus one GCG string optimised over training scenarios of InjecAgent dh and ds "
    "with their goals planted",
    lambda _context: UNIVERSAL_CALL_MIXED,
)
_string_attack(
    UNIVERSAL_CALL_STAGED,
    "the attacker's goal written out plus one GCG string optimised over training scenarios of InjecAgent dh and ds "
    "with their goals planted, on each call of the goal at its own decision point (data stealing: extract, then send)",
    lambda _context: UNIVERSAL_CALL_STAGED,
)
_string_attack(
    RANDOM,
    "control: the native injection plus random plantable tokens, as many as the universal string has",
    lambda _context: RANDOM,
)


def _adaptive_rewrite(scenario: Scenario, context: AttackContext) -> Scenario:
    if context.defense in GATED_DEFENSES:
        return gate_aware.rewrite(scenario, context)
    return append_string(scenario, _stored(adaptive_name(context.defense), context))


def _adaptive_fingerprint(context: AttackContext) -> str:
    if context.defense in GATED_DEFENSES:
        return gate_aware.FINGERPRINT
    return _fingerprint(adaptive_name(context.defense), context)


register(
    AttackSpec(
        ADAPTIVE,
        "the attack made against the cell's defense: an optimised string, or a goal the tool gate allows",
        rewrite=_adaptive_rewrite,
        fingerprint=_adaptive_fingerprint,
    )
)
_string_attack(
    ADAPTIVE_CALL,
    "the attacker's goal written out plus one universal string made against the cell's defense (its detector's "
    "score in the objective), from the gcg_universal_call string",
    lambda context: adaptive_call_name(context.defense),
)
register(
    AttackSpec(
        ADAPTIVE_PER_SCENARIO,
        "the per-scenario string made against the cell's defense (its detector's score in the objective)",
        rewrite=lambda scenario, context: append_own_string(
            scenario, context, adaptive_per_scenario_name(context.defense)
        ),
        fingerprint=lambda context: _per_scenario_fingerprint(context, adaptive_per_scenario_name(context.defense)),
    )
)
