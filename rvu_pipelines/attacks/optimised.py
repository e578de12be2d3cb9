"""Attacks with strings optimised on the agent's own weights: the universal string and the adaptive ones.

``gcg_universal`` appends one string, optimised with GCG over a training split of InjecAgent scenarios on the
de-quantised copy of the agent's GGUF, to every scenario's native injection. ``adaptive`` appends the string
optimised against the defense of the cell it runs in (the attacker moves second):

- ``vanilla``: nothing to adapt to; the universal string;
- ``classifier``: a joint objective, the attacker's tool call plus a low score of the classifier's own detector
  on the planted text. The production detector is an int8 ONNX graph, so its term is scored black-box on every
  candidate string, not differentiated;
- ``fath``: optimised on prompts captured through FATH's own pipeline with a fresh random tag per prompt, so the
  string works in expectation over tags it cannot see.

Other defenses have no adaptive attack here; asking for one says so. Training scenarios are drawn from a fixed
hash split of each benchmark that excludes the canonical 10, and :func:`training_ids` lets every evaluation leave
them out.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rvu_pipelines.attacks.catalog import AttackContext, AttackSpec, register
from rvu_pipelines.attacks.gcg import GcgConfig, GcgOptimizer, Penalty
from rvu_pipelines.attacks.stored import StoredString, load_string, save_string, string_path
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.contract import Scenario

UNIVERSAL = "gcg_universal"
RANDOM = "random_string"  # the unoptimised control: random plantable tokens, as many as the universal string's
ADAPTIVE = "adaptive"
TRAIN_BENCHMARK = "injecagent_dh"
TRAIN_SPLIT_MODULUS = 20  # one scenario id in 20 (by sha256) may be used to train strings; never evaluated
# the string each defense faces under ``adaptive``; the objective and capture pipeline of each are in OBJECTIVES
ADAPTIVE_STRINGS: dict[str, str] = {"vanilla": UNIVERSAL, "classifier": "adaptive-classifier", "fath": "adaptive-fath"}
OBJECTIVES: dict[str, tuple[str, str]] = {  # string name -> (capture defense, objective in words)
    UNIVERSAL: ("vanilla", "mean cross-entropy of the attacker's tool call over the training prompts"),
    "adaptive-classifier": (
        "vanilla",
        "the attacker's tool call plus the classifier defense's detector score on the planted text (black-box)",
    ),
    "adaptive-fath": ("fath", "the attacker's tool call through FATH's pipeline, a fresh random tag per prompt"),
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


def _stored(name: str, context: AttackContext) -> StoredString:
    return load_string(string_path(context.strings_dir, name, context.profile), context.model_sha256)


def adaptive_name(defense: str) -> str:
    """The stored string the ``adaptive`` attack uses against ``defense``."""
    if defense not in ADAPTIVE_STRINGS:
        raise ConfigError(
            f"No adaptive attack against defense {defense!r} yet; the defenses with one: "
            f"{', '.join(sorted(ADAPTIVE_STRINGS))}. Run the cell with attack gcg_universal or native instead."
        )
    return ADAPTIVE_STRINGS[defense]


def append_string(scenario: Scenario, stored: StoredString) -> Scenario:
    """The native injection with the optimised string right after it (where it was optimised to act)."""
    if stored.train_scenarios and scenario.scenario_id in stored.train_scenarios:
        raise ConfigError(
            f"{scenario.scenario_id} trained the string {stored.name!r}; evaluate on held-out scenarios "
            "(leave out training_ids())."
        )
    return scenario.with_injection(scenario.injection + stored.text)


def training_ids(context: AttackContext, name: str) -> frozenset[str]:
    """The scenarios the string ``name`` was trained on (empty when it is not stored)."""
    try:
        return frozenset(_stored(name, context).train_scenarios)
    except ConfigError:
        return frozenset()


def _fingerprint(name: str, context: AttackContext) -> str:
    stored = _stored(name, context)
    return hashlib.sha256(f"{stored.model_sha256}/{stored.text}".encode()).hexdigest()[:16]


register(
    AttackSpec(
        UNIVERSAL,
        "the native injection plus one GCG string optimised on the agent's weights over training scenarios",
        rewrite=lambda scenario, context: append_string(scenario, _stored(UNIVERSAL, context)),
        fingerprint=lambda context: _fingerprint(UNIVERSAL, context),
    )
)
register(
    AttackSpec(
        RANDOM,
        "control: the native injection plus random plantable tokens, as many as the universal string has",
        rewrite=lambda scenario, context: append_string(scenario, _stored(RANDOM, context)),
        fingerprint=lambda context: _fingerprint(RANDOM, context),
    )
)
register(
    AttackSpec(
        ADAPTIVE,
        "the native injection plus the string optimised against the cell's defense",
        rewrite=lambda scenario, context: append_string(scenario, _stored(adaptive_name(context.defense), context)),
        fingerprint=lambda context: _fingerprint(adaptive_name(context.defense), context),
    )
)


# ------------------------------------------------------------------------------------------ optimisation


def detector_penalty(detector: Any, injections: Sequence[str]) -> Penalty:
    """The classifier defense's term of the joint objective: its detector's mean score of the planted texts (each
    training scenario's injection followed by the candidate string), the text its filter reads in the tool output."""

    def penalty(texts: Sequence[str]) -> list[float]:
        planted = [f"{injection}{text}" for text in texts for injection in injections]
        scores = [float(s) for s in detector.score(planted)]
        per = len(injections)
        return [sum(scores[i * per : (i + 1) * per]) / per for i in range(len(texts))]

    return penalty


def optimise_string(
    name: str,
    *,
    profile: str,
    model_sha256: str,
    model: Any,
    tokenizer: Any,
    scenarios: Sequence[Scenario],
    settings: Any,
    config: GcgConfig,
    state_path: Path,
    strings_dir: Path,
    penalty: Penalty | None = None,
    llm: Any = None,
    progress: bool = True,
    provenance: dict[str, str] | None = None,
) -> StoredString:
    """Optimise (or resume) the string ``name`` over ``scenarios`` and store it under ``strings_dir``.

    ``settings``: DefenseSettings of the capture pipeline (OBJECTIVES[name]); ``provenance``: code_version,
    created, machine for the file."""
    from rvu_pipelines.attacks.decision_point import slot_for

    if name not in OBJECTIVES:
        raise ConfigError(f"Unknown optimised string {name!r}; allowed values: {', '.join(sorted(OBJECTIVES))}.")
    defense, objective = OBJECTIVES[name]
    if defense == "fath":  # the attacker cannot see the episode's tag: a fresh random one per captured prompt
        settings = dataclasses.replace(settings, fath_random_tags=True)
    slots = [slot for s in scenarios if (slot := slot_for(s, tokenizer, settings, defense=defense, llm=llm))]
    if not slots:
        raise ConfigError(f"None of the {len(scenarios)} training scenarios reaches the agent under {defense}.")
    optimizer = GcgOptimizer(model, tokenizer, slots, config, model_sha256)
    optimizer.penalty = penalty
    state = optimizer.run(state_path, progress=progress)
    text = tokenizer.decode(state.best_ids)
    stored = StoredString(
        name=name,
        profile=profile,
        model_sha256=model_sha256,
        text=text,
        token_ids=tuple(state.best_ids),
        objective=objective,
        defense=defense,
        train_scenarios=tuple(slot.slot_id for slot in slots),
        steps=state.step,
        loss=round(state.best_loss, 6),
        solved=state.solved,
        cpu_minutes=round(state.cpu_seconds / 60, 2),
        config={k: v for k, v in vars(config).items()},
        **(provenance or {}),
    )
    save_string(string_path(strings_dir, name, profile), stored)
    if name == UNIVERSAL:  # its control, beside it: what the same number of unoptimised tokens does
        save_string(string_path(strings_dir, RANDOM, profile), random_control(stored, optimizer, config.seed))
    return stored


def random_control(universal: StoredString, optimizer: GcgOptimizer, seed: int) -> StoredString:
    """Random plantable tokens, as many as ``universal`` has (seeded; redrawn until they survive retokenization)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    tokenizer = optimizer.tokenizer
    for _ in range(100):
        ids = optimizer.allowed[torch.randint(0, len(optimizer.allowed), (len(universal.token_ids),), generator=generator)]
        text = tokenizer.decode(ids.tolist())
        if list(tokenizer.encode(text, add_special_tokens=False)) == ids.tolist():
            break
    loss, solved = optimizer.losses(ids[None])
    return dataclasses.replace(
        universal,
        name=RANDOM,
        text=text,
        token_ids=tuple(ids.tolist()),
        objective=f"none: random plantable tokens (seed {seed}), the control of {universal.name}",
        steps=0,
        loss=round(float(loss[0]), 6),  # on the training prompts, beside the optimised string's
        solved=bool(solved[0]),
        cpu_minutes=0.0,
    )
