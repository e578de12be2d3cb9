"""Check a universal attack string on PyTorch for each held-out scenario of the attack table's sample, so the
study can report its PyTorch → llama.cpp transfer beside the episodes.

    RVU_DATA_MIRROR=../shared/data .venv/bin/python scripts/universal_transfer.py --name gcg_universal_call \
        --benchmark injecagent_dh --benchmark injecagent_ds --n 100

For every scenario of ``heldout_sample(benchmark, n)`` (the table's sample for ``per_benchmark: n``) it records
whether the attacker's call is the greedy reply of the de-quantised PyTorch copy of the agent's GGUF with the string
planted, and the target's cross-entropy, under ``<RVU_HOME>/attacks/transfer/<name>_<profile>.json``. Then
``make attacks`` (a config with the string's attack and ``vanilla``) prints the transfer table.
"""

from __future__ import annotations

import argparse
import sys

from rvu_pipelines.attacks.optimised import UNIVERSAL_CALL
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.redteam.transfer import TRANSFER_STRINGS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default=UNIVERSAL_CALL, choices=TRANSFER_STRINGS)
    parser.add_argument("--profile", default=None, help="model profile (configs/models.yaml); default: its default")
    parser.add_argument("--benchmark", action="append", default=None, help="repeatable; default injecagent_dh")
    parser.add_argument("--n", type=int, default=100, help="the table's per_benchmark (its held-out sample)")
    args = parser.parse_args(argv)
    try:
        for line in run(args):
            print(line)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def run(args: argparse.Namespace) -> list[str]:
    from rvu_pipelines.agents.defenses import DefenseSettings
    from rvu_pipelines.attacks.stored import load_string, string_path
    from rvu_pipelines.detectors import HeuristicDetector
    from rvu_pipelines.models import ModelStore, load_model_config
    from rvu_pipelines.models.dequantized import load_dequantized
    from rvu_pipelines.paths import config_dir, state_dir
    from rvu_pipelines.redteam.table import heldout_sample
    from rvu_pipelines.redteam.transfer import pytorch_outcomes, save_outcomes, transfer_path

    models = load_model_config()
    profile = args.profile or models.default_profile
    resolved = ModelStore().resolve("llm", models.profile(profile)["llm"])
    stored = load_string(string_path(config_dir() / "attacks", args.name, profile), resolved.sha256)
    model, tokenizer = load_dequantized(resolved.path, sha256=resolved.sha256, attn_implementation="sdpa")
    model.requires_grad_(False)
    settings = DefenseSettings(detector=HeuristicDetector())  # the undefended agent's prompt, as optimised
    path = transfer_path(state_dir() / "attacks" / "transfer", args.name, profile)
    lines = []
    for benchmark in args.benchmark or ["injecagent_dh"]:
        outcomes = pytorch_outcomes(stored, heldout_sample(benchmark, args.n), model, tokenizer, settings)
        save_outcomes(path, stored, outcomes)
        solved = sum(o.solved for o in outcomes)
        lines.append(f"{benchmark}: the call is greedy on PyTorch in {solved}/{len(outcomes)} held-out scenarios")
    lines.append(f"written to {path}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
