"""The adapter-zoo study (seed 000 E4 gate, E5 influence; issue 15): train the zoo, score it, report.

    .venv/bin/python scripts/adapter_study.py                 # train what is missing, score all, print tables
    .venv/bin/python scripts/adapter_study.py --only tofu-qa persona-hostile --no-score
    .venv/bin/python scripts/adapter_study.py --threads 1     # beside other CPU work

Adapters go to <RVU_HOME>/adapters/<id>/ (reused when their data and settings are unchanged); scores and the
gate table to --out (default <RVU_HOME>/adapter_study/).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=None, help="adapter ids (default: the whole zoo + reference)")
    parser.add_argument("--no-train", action="store_true")
    parser.add_argument("--no-score", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--probes", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch

    from rvu_pipelines.adapters.gate import evaluate_gate, load_gate_config
    from rvu_pipelines.adapters.report import gate_markdown
    from rvu_pipelines.adapters.study import AdapterLab, influence_summary, scores_frame
    from rvu_pipelines.adapters.zoo import load_zoo_config
    from rvu_pipelines.paths import state_dir

    torch.set_num_threads(args.threads)
    out = args.out or state_dir() / "adapter_study"
    out.mkdir(parents=True, exist_ok=True)
    config = load_zoo_config()
    started = time.perf_counter()
    lab = AdapterLab.for_profile(n_probes=args.probes)
    print(f"base model and {len(lab.prompts)} probe prompts ready in {time.perf_counter() - started:.1f} s", flush=True)
    if not args.no_train:
        rows = []
        for entry in config.entries:
            if args.only is not None and entry.id not in args.only:
                continue
            row = lab.train(config, ids=[entry.id])[0]
            rows.append(row)
            state = "trained" if row["trained_now"] else "reused"
            line = f"  {entry.id:32s} {state:7s} {row['seconds']:7.1f} s  final loss {row['final_loss']:.3f}"
            print(line, flush=True)
        (out / "training.json").write_text(json.dumps(rows, indent=1))
    if args.no_score:
        return 0
    gate = load_gate_config()
    reference = lab.verify(gate.reference_adapter)
    scores = []
    for entry in config.adapters:
        if args.only is not None and entry.id not in args.only:
            continue
        score = lab.score(lab.verify(entry.id), reference, gate)
        scores.append(score)
        print(
            f"  {score.adapter_id:32s} {score.label:7s} projection {score.projection:+.4f} "
            f"safe-lora {score.safe_lora:.4f} "
            f"ood {score.ood:8.3f} influence {score.influence:.3f} ({score.gate_seconds:.1f} s gate)",
            flush=True,
        )
    frame = scores_frame(scores)
    frame.write_csv(out / "scores.csv")
    evaluation = evaluate_gate([s.gate_scores() for s in scores], gate.false_positive_budget)
    summary = {"gate": evaluation.to_dict(), "influence": influence_summary(scores)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    table = gate_markdown(evaluation, summary["influence"], frame)
    (out / "gate.md").write_text(table)
    print(table)
    print(f"done in {time.perf_counter() - started:.0f} s; outputs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
