"""Making the optimised strings: GCG over training scenarios' real prompts, stored with their weights' sha256.

The registered attacks that use the strings (``gcg_universal``, ``random_string``, ``adaptive``) live in
:mod:`rvu_pipelines.attacks.optimised`; this module produces the files they read. It sits above the agent package
because an optimisation slot is the prompt a defense's real pipeline builds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rvu_pipelines.attacks.gcg import GcgConfig, GcgOptimizer, Penalty
from rvu_pipelines.attacks.optimised import (
    DETECTOR_DEFENSES,
    OBJECTIVES,
    PER_SCENARIO_STRINGS,
    RANDOM,
    UNIVERSAL,
    WARM_STARTS,
    decision_stages,
    per_scenario_path,
    slot_scenario,
)
from rvu_pipelines.attacks.stored import StoredString, load_string, save_string, string_path
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.redteam.decision_point import SENTINEL
from rvu_pipelines.scenarios.contract import Scenario


def detector_penalty(detector: Any, templates: Sequence[str]) -> Penalty:
    """A detector defense's term of the joint objective: its detector's mean score of the texts it reads
    (``templates``: what it read at the decision point, the sentinel where the candidate string goes)."""
    if not templates:
        raise ConfigError("A detector penalty needs at least one text the defense reads; none was captured.")

    def penalty(texts: Sequence[str]) -> list[float]:
        planted = [template.replace(SENTINEL, text) for text in texts for template in templates]
        scores = [float(s) for s in detector.score(planted)]
        per = len(templates)
        return [sum(scores[i * per : (i + 1) * per]) / per for i in range(len(texts))]

    return penalty


def warm_start(
    name: str, config: GcgConfig, *, strings_dir: Path, profile: str, model_sha256: str, tokenizer: Any
) -> GcgConfig:
    """``config`` starting from the stored string ``name`` adapts (``WARM_STARTS``), at least as long as it; other
    strings unchanged. The attacker adapting to a defense starts from its best string without the defense."""
    if name not in WARM_STARTS:
        return config
    start = load_string(string_path(strings_dir, WARM_STARTS[name], profile), model_sha256).text
    length = len(tokenizer.encode(start, add_special_tokens=False))
    return dataclasses.replace(config, init_text=start, n_tokens=max(config.n_tokens, length))


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
    penalty_detector: Any = None,
    llm: Any = None,
    progress: bool = True,
    provenance: dict[str, str] | None = None,
) -> StoredString:
    """Optimise (or resume) the string ``name`` over ``scenarios`` and store it under ``strings_dir``.

    ``settings``: DefenseSettings of the capture pipeline (OBJECTIVES[name]); ``penalty_detector``: for a string
    adapted to a detector defense (``classifier``, ``hfer``), that defense's detector, whose score of the texts it
    reads joins the objective; ``provenance``: code_version, created, machine for the file. A per-scenario string
    takes exactly one scenario, the one it will be planted in."""
    from rvu_pipelines.redteam.decision_point import capture

    if name not in OBJECTIVES:
        raise ConfigError(f"Unknown optimised string {name!r}; allowed values: {', '.join(sorted(OBJECTIVES))}.")
    if name in PER_SCENARIO_STRINGS and len(scenarios) != 1:
        raise ConfigError(f"{name} is optimised on one scenario at a time, got {len(scenarios)}.")
    defense, objective = OBJECTIVES[name]
    if (penalty_detector is not None) != (defense in DETECTOR_DEFENSES):
        raise ConfigError(
            f"{name} is captured under {defense}: "
            + (
                "pass that defense's detector as penalty_detector."
                if defense in DETECTOR_DEFENSES
                else "it has no detector term."
            )
        )
    if defense == "fath":  # the attacker cannot see the episode's tag: a fresh random one per captured prompt
        settings = dataclasses.replace(settings, fath_random_tags=True)
    planted = [slot_scenario(name, s) for s in scenarios]
    points = [(s, answers, target) for s in planted for answers, target in decision_stages(name, s)]
    captured = [
        (s.scenario_id, c)
        for s, answers, target in points
        if (c := capture(s, tokenizer, settings, defense=defense, llm=llm, target=target, answers=answers))
    ]
    captures = [c for _, c in captured]
    slots = [c.slot for c in captures]
    if not slots:
        raise ConfigError(f"None of the {len(scenarios)} training scenarios reaches the agent under {defense}.")
    penalty, penalty_key = None, ""
    if penalty_detector is not None:
        read = [text for c in captures for text in c.read]
        penalty = detector_penalty(penalty_detector, read)
        version = getattr(penalty_detector, "version", None) or type(penalty_detector).__name__
        penalty_key = json.dumps([str(version), read])
    optimizer = GcgOptimizer(model, tokenizer, slots, config, model_sha256, penalty, penalty_key)
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
        train_scenarios=tuple(dict.fromkeys(scenario_id for scenario_id, _ in captured)),
        steps=state.step,
        loss=round(state.best_loss, 6),
        solved=state.solved,
        cpu_minutes=round(state.cpu_seconds / 60, 2),
        config={k: v for k, v in vars(config).items()},
        **(provenance or {}),
    )
    if name in PER_SCENARIO_STRINGS:
        save_string(per_scenario_path(strings_dir, profile, stored.train_scenarios[0], name), stored)
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
