"""Optimise an attack string on the agent's own weights (GCG) and store it under configs/attacks.

Threat model: white-box. The attacker has the agent's weights (a public 135M model), its system prompt, tool-call
format and tool schemas, writes the text of one tool output, and cannot see anything an episode adds later (the
user's other turns, FATH's per-episode tag). It optimises on the de-quantised PyTorch copy of the GGUF; success
is always measured afterwards by the real agent on llama.cpp with the quantised GGUF.

    RVU_DATA_MIRROR=../shared/data .venv/bin/python scripts/optimise_attack.py [--name gcg_universal]
        [--train 8] [--steps 60] [--candidates 32] [--tokens 16] [--profile tiny]
    .venv/bin/python scripts/optimise_attack.py --name gcg_per_scenario --benchmark injecagent_dh --sample 5

``gcg_per_scenario`` optimises one string per scenario for ``--sample`` scenarios drawn from the attack table's
held-out sample of ``--benchmark``, each planted only in its own scenario: the attacker also knows the user's request.
``adaptive-classifier_call`` adapts the universal string on the planted goal (``gcg_universal_call``) to the
classifier defense: it starts from that string and adds the classifier's detector score of the text it reads:

    .venv/bin/python scripts/optimise_attack.py --name adaptive-classifier_call --train 8 --steps 40 --tokens 12

``adaptive-classifier_per_scenario`` and ``adaptive-hfer_per_scenario`` adapt each of those strings to a detector
defense: they start from the scenario's stored ``gcg_per_scenario`` string and add the defense's score of the text
its detector reads to the objective (a string is solved when the call is greedy and the score under ``--evade-below``):

    .venv/bin/python scripts/optimise_attack.py --name adaptive-hfer_per_scenario --benchmark injecagent_dh --sample 10

Interrupted anywhere (even SIGKILL), the same command resumes from the last finished step (the state lives in
``.rvu/attacks/optimisation/``). The stored file records the weights' sha256, training scenarios, steps, loss,
CPU-minutes, commit, date and machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rvu_pipelines.attacks.gcg import GcgConfig
from rvu_pipelines.attacks.optimised import (
    OBJECTIVES,
    PER_SCENARIO,
    PER_SCENARIO_STRINGS,
    TRAIN_BENCHMARK,
    per_scenario_path,
    universal_training_scenarios,
)
from rvu_pipelines.attacks.planted_call import target_text
from rvu_pipelines.attacks.stored import StoredString, load_string
from rvu_pipelines.code_version import code_version
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.machine import machine_line
from rvu_pipelines.paths import config_dir, state_dir
from rvu_pipelines.redteam.optimise import optimise_string, warm_start
from rvu_pipelines.redteam.table import per_scenario_sample


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="gcg_universal", choices=sorted(OBJECTIVES))
    parser.add_argument("--profile", default=None, help="model profile (configs/models.yaml); default: its default")
    parser.add_argument(
        "--train", type=int, default=8, help="training scenarios per benchmark the string trains on (InjecAgent dh)"
    )
    parser.add_argument("--benchmark", default=TRAIN_BENCHMARK, help="per-scenario strings: the benchmark sampled")
    parser.add_argument("--sample", type=int, default=5, help="per-scenario strings: held-out scenarios, one each")
    parser.add_argument(
        "--warm-start",
        action="store_true",
        help="gcg_per_scenario: the string starts as the attacker's goal written out (at least --tokens long)",
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--candidates", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--penalty-weight", type=float, default=1.0, help="adaptive strings: detector term weight")
    parser.add_argument("--detector", default="production", help="adaptive-classifier*: the defense's detector")
    parser.add_argument(
        "--evade-below",
        type=float,
        default=0.5,
        help="adaptive per-scenario strings: solved only with the detector's score under this (its threshold)",
    )
    parser.add_argument("--strings-dir", type=Path, default=None, help="default: configs/attacks")
    parser.add_argument("--state-dir", type=Path, default=None, help="default: .rvu/attacks/optimisation")
    args = parser.parse_args(argv)
    try:
        stored = run(args, sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for one in stored:
        print(
            f"{one.name}: {one.text!r}\n  loss {one.loss:.4f}, solved {one.solved}, {one.steps} steps, "
            f"{one.cpu_minutes:.1f} CPU-min, trained on {', '.join(one.train_scenarios)}"
        )
    return 0


def run(args: argparse.Namespace, argv: list[str] | None = None) -> list[StoredString]:
    if args.warm_start and args.name != PER_SCENARIO:
        raise ConfigError(f"--warm-start starts from one scenario's goal: it applies to {PER_SCENARIO} only.")
    import torch

    from rvu_pipelines.agents.defenses import DefenseSettings
    from rvu_pipelines.agents.harness import detector_for
    from rvu_pipelines.detectors import HeuristicDetector
    from rvu_pipelines.models import ModelStore, load_model_config
    from rvu_pipelines.models.dequantized import load_dequantized
    from rvu_pipelines.scenarios.registry import canonical_scenarios

    models = load_model_config()
    profile = args.profile or models.default_profile
    resolved = ModelStore().resolve("llm", models.profile(profile)["llm"])
    model, tokenizer = load_dequantized(resolved.path, sha256=resolved.sha256, attn_implementation="sdpa")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    torch.manual_seed(args.seed)
    canonical = frozenset(s.scenario_id for s in canonical_scenarios())
    if args.name in PER_SCENARIO_STRINGS:
        groups = [[s] for s in per_scenario_sample(args.benchmark, args.sample)]
    else:
        groups = [universal_training_scenarios(args.name, args.train, exclude=canonical)]
    strings_dir = args.strings_dir or config_dir() / "attacks"
    adapted_to = OBJECTIVES[args.name][0]
    penalty_detector: Any = None
    if adapted_to == "classifier":
        penalty_detector, _ = detector_for(args.detector)
    elif adapted_to == "hfer":
        from rvu_pipelines.spectral.agent_switch import LazyHferDetector

        penalty_detector = LazyHferDetector.for_profile(profile, expected_sha256=resolved.sha256)
    adapts_own = args.name in PER_SCENARIO_STRINGS and args.name != PER_SCENARIO
    gcg = GcgConfig(
        n_tokens=args.tokens,
        steps=args.steps,
        candidates=args.candidates,
        top_k=args.top_k,
        seed=args.seed,
        penalty_weight=args.penalty_weight if penalty_detector is not None else 0.0,
        evade_below=args.evade_below if adapts_own else 0.0,
    )
    states = args.state_dir or state_dir() / "attacks" / "optimisation"
    provenance = {
        "code_version": code_version(),
        "created": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine_line(),
        "command": shlex.join(["python", "scripts/optimise_attack.py", *(argv or [])]),
    }
    stored = []
    for group in groups:
        state_name = f"{args.name}_{profile}"
        config = warm_start(
            args.name, gcg, strings_dir=strings_dir, profile=profile, model_sha256=resolved.sha256, tokenizer=tokenizer
        )
        if args.name in PER_SCENARIO_STRINGS:
            state_name += "/" + group[0].scenario_id.replace("/", "__")
            start = ""
            if args.warm_start:  # the string starts as the attacker's goal written out
                start = " " + target_text(group[0])
            if adapts_own:  # the attacker adapts its best string for this scenario to the defense
                start = load_string(per_scenario_path(strings_dir, profile, group[0].scenario_id), resolved.sha256).text
            if start:  # at least as long as where it starts
                length = len(tokenizer.encode(start, add_special_tokens=False))
                config = dataclasses.replace(gcg, init_text=start, n_tokens=max(gcg.n_tokens, length))
        stored.append(
            optimise_string(
                args.name,
                profile=profile,
                model_sha256=resolved.sha256,
                model=model,
                tokenizer=tokenizer,
                scenarios=group,
                settings=DefenseSettings(detector=HeuristicDetector()),  # capture() reads in place of its detectors
                config=config,
                state_path=states / f"{state_name}.json",
                strings_dir=strings_dir,
                penalty_detector=penalty_detector,
                provenance=provenance,
            )
        )
    return stored


if __name__ == "__main__":
    sys.exit(main())
