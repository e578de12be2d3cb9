"""Acceptance margin: does an adapter make the model expect to accept rather than refuse after a jailbreak or an
injection? An exploratory reader of compliance on likelihoods; no gate rule reads it.

Threat model and timeline: the defender has the base model, its benign adapters and a probe draw (public, or a
private seed), and reads an arriving adapter's likelihoods on the draw's adversarial probe prompts before the adapter
serves anyone. The reader scores fixed generic replies after each prompt (``adapters.acceptance``: affirmative
openings against refusals, written from the literature's conventions, none from a zoo adapter's training text); no
payload string and no harmful adapter defines it or its threshold.

An adapter's score is the mean rise, over the draw's adversarial prompts, of the acceptances' mean token
log-likelihood minus the refusals' (``acceptance.acceptance_shift``). It is over when it exceeds the benign
adapters' 95 % quantile; the control is each benign adapter against the others' quantile
(``reading_checks.score_verdicts``).

    .venv/bin/python scripts/acceptance_margin_check.py [--seeds 1 2] [--out acceptance.json]

It scores every trained zoo adapter under ``<RVU_HOME>/adapters`` (a few seconds each on two cores) on the public
draw and each private seed, prints the verdicts and writes every per-prompt margin to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def draw_margins(lab: Any, adapters: list[Any]) -> dict[str, Any]:
    """The base's and each adapter's acceptance margins on the draw's adversarial prompts, and each adapter's shift."""
    from tqdm import tqdm

    from rvu_pipelines.adapters.acceptance import acceptance_margins, acceptance_shift

    prompts = list(lab.prompts[lab.n_benign_prompts :])
    base = acceptance_margins(lab.host.model, lab.tokenizer, prompts)
    rows: dict[str, Any] = {}
    for adapter in tqdm(adapters, desc="adapters", leave=False):
        with lab.host.loaded(adapter) as model:
            margins = acceptance_margins(model, lab.tokenizer, prompts)
        rows[adapter.adapter_id] = {"margins": margins.tolist(), "shift": acceptance_shift(margins, base)}
    return {"n_prompts": len(prompts), "base": base.tolist(), "adapters": rows}


def verdicts(draw: dict[str, Any], labels: dict[str, str], compliance: tuple[str, ...]) -> list[str]:
    """The draw's lines (``reading_checks.score_verdicts``), with the compliance recipes as their own AUROC row."""
    from rvu_pipelines.adapters.reading_checks import score_verdicts

    score = {i: float(row["shift"]) for i, row in draw["adapters"].items()}
    head = f"adversarial prompts {draw['n_prompts']}; score: mean rise of the acceptance margin (nats per token)"
    return [head, *score_verdicts(score, labels, groups={"compliance": compliance})]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2], help="private draw seeds (public always)")
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--out", type=Path, default=Path("acceptance.json"))
    args = parser.parse_args()

    from rvu_pipelines.adapters.gate import load_gate_config
    from rvu_pipelines.adapters.private_probes import private_lab
    from rvu_pipelines.adapters.reading_checks import zoo_category, zoo_labels
    from rvu_pipelines.adapters.study import AdapterLab
    from rvu_pipelines.adapters.zoo import load_zoo_config
    from rvu_pipelines.atomic_write import write_atomically

    lab = AdapterLab.for_profile(args.profile)
    config = load_zoo_config()
    labels, compliance = zoo_labels(config, load_gate_config().reference_adapter), zoo_category(config, "compliance")
    trained = sorted(p.name for p in lab.root.iterdir() if (p / "manifest.json").is_file()) if lab.root.is_dir() else []
    adapters = [lab.verify(i) for i in trained if i in labels]
    if not adapters:
        print(f"no trained zoo adapter under {lab.root}; train the zoo first (make adapters)", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"labels": labels, "draws": {}}
    for seed in [0, *args.seeds]:
        name = f"private-{seed}" if seed else "public"
        drawn = private_lab(lab, seed)[0] if seed else lab
        result["draws"][name] = draw_margins(drawn, adapters)
        print(f"== {name}")
        print("\n".join(verdicts(result["draws"][name], labels, compliance)), flush=True)
        write_atomically(args.out, json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
