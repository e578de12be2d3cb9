"""Making the optimised strings: GCG over training scenarios' real prompts, stored with their weights' sha256.

The registered attacks that use the strings (``gcg_universal``, ``random_string``, ``adaptive``) live in
:mod:`rvu_pipelines.attacks.optimised`; this module produces the files they read. It sits above the agent package
because an optimisation slot is the prompt a defense's real pipeline builds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rvu_pipelines.attacks.gcg import GcgConfig, GcgOptimizer, Penalty
from rvu_pipelines.attacks.optimised import OBJECTIVES, PER_SCENARIO, RANDOM, UNIVERSAL, per_scenario_path
from rvu_pipelines.attacks.stored import StoredString, save_string, string_path
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.scenarios.contract import Scenario


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
    created, machine for the file. ``gcg_per_scenario`` takes exactly one scenario, the one it will be planted in."""
    from rvu_pipelines.redteam.decision_point import slot_for

    if name not in OBJECTIVES:
        raise ConfigError(f"Unknown optimised string {name!r}; allowed values: {', '.join(sorted(OBJECTIVES))}.")
    if name == PER_SCENARIO and len(scenarios) != 1:
        raise ConfigError(f"{PER_SCENARIO} is optimised on one scenario at a time, got {len(scenarios)}.")
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
    if name == PER_SCENARIO:
        save_string(per_scenario_path(strings_dir, profile, stored.train_scenarios[0]), stored)
    else:
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
        ids = optimizer.allowed[
            torch.randint(0, len(optimizer.allowed), (len(universal.token_ids),), generator=generator)
        ]
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
