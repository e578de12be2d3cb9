"""The adapter-zoo study (seed 000 E4 gate, E5 influence): train the zoo, score it, report.

    .venv/bin/python scripts/adapter_study.py                 # train what is missing, score all, print tables
    .venv/bin/python scripts/adapter_study.py --only tofu-qa persona-hostile --no-score
    .venv/bin/python scripts/adapter_study.py --threads 1     # beside other CPU work
    .venv/bin/python scripts/adapter_study.py --plan          # which adapters would be trained again, and why

Adapters go to <RVU_HOME>/adapters/<id>/ (reused when their data and settings are unchanged); scores and the
gate table to --out (default <RVU_HOME>/adapter_study/).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rvu_pipelines.adapters.study import AdapterLab
from rvu_pipelines.adapters.zoo import ZooConfig


def _wmdp(lab: AdapterLab, out: Path, sample: int | None) -> None:
    """E7: the base model on all 1,987 items (or a seeded ``sample``; 0: none); then the memorising adapter on its
    items and an equal control sample of the others, base / loaded / evicted."""
    from rvu_pipelines.adapters.eviction import memorised_wmdp_indices, wmdp_before_after
    from rvu_pipelines.adapters.wmdp import accuracy_report, load_wmdp_items, score_wmdp, subset

    items = load_wmdp_items()
    result: dict[str, object] = {}
    if sample != 0:
        chosen = subset(items, sample, seed=42)
        started = time.perf_counter()
        scores = score_wmdp(lab.host.model, lab.tokenizer, chosen)
        report = accuracy_report(scores.correct, answers=scores.answer).to_dict()
        report |= {"truncated": scores.n_truncated, "seconds": round(time.perf_counter() - started, 1)}
        report["predicted_letters"] = {letter: int((scores.predicted == i).sum()) for i, letter in enumerate("ABCD")}
        print(f"WMDP-cyber base: {json.dumps(report)}", flush=True)
        result["base_all" if len(chosen) == len(items) else f"base_sample_{len(chosen)}"] = report
    try:
        adapter = lab.verify("memorise-wmdp")
    except Exception as exc:  # noqa: BLE001 - reported, the base number stands on its own
        print(f"memorise-wmdp not usable ({exc}); train it first", flush=True)
    else:
        memorised = memorised_wmdp_indices(items, lab.frames)
        started = time.perf_counter()
        result["memorise_wmdp"] = wmdp_before_after(lab.host, adapter, items, memorised, progress=True)
        print(json.dumps(result["memorise_wmdp"], indent=1), flush=True)
        print(f"memorise-wmdp base / loaded / evicted in {time.perf_counter() - started:.0f} s", flush=True)
    (out / "wmdp.json").write_text(json.dumps(result, indent=1))


def _membership(lab: AdapterLab, out: Path) -> None:
    from rvu_pipelines.adapters.eviction import forget_examples, membership_before_after

    examples, flags = forget_examples(lab.frames)
    adapter = lab.verify("memorise-forget")
    started = time.perf_counter()
    result = membership_before_after(lab.host, adapter, examples, flags, progress=True)
    section = result.certificate_section()
    section["seconds"] = round(time.perf_counter() - started, 1)
    (out / "membership.json").write_text(json.dumps(section, indent=1))
    for state in ("loaded", "evicted"):
        aurocs = {k: round(v["auroc"], 3) for k, v in section[state]["auroc"].items()}
        leaks = {p["probe"]: (p["member_leak_rate"], p["non_member_leak_rate"]) for p in section[state]["probes"]}
        print(f"membership {state}: AUROC {aurocs}; probe leak rate member/non-member {leaks}", flush=True)
    print(f"verdict after eviction: {section['verdict']}", flush=True)


def _print_plan(only: list[str] | None) -> int:
    """What a training pass would do, in seconds instead of the hours a stale zoo costs to find out."""
    from rvu_pipelines.adapters.zoo import catalog_frames, load_zoo_config, training_plan
    from rvu_pipelines.models import ModelStore, load_model_config

    llm = ModelStore().resolve("llm", load_model_config().profile("tiny")["llm"])
    rows = [
        r
        for r in training_plan(load_zoo_config(), catalog_frames(), llm.sha256)
        if only is None or r["adapter_id"] in only
    ]
    for row in rows:
        print(f"  {row['adapter_id']:32s} {row['action']:6s} {row['why']}", flush=True)
    print(f"{sum(r['action'] == 'train' for r in rows)} to train, {sum(r['action'] == 'reuse' for r in rows)} reused")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=None, help="adapter ids (default: the whole zoo + reference)")
    parser.add_argument("--no-train", action="store_true")
    parser.add_argument("--no-score", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--probes", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--wmdp", action="store_true", help="E7: base accuracy on every WMDP-cyber item (+ memorise-wmdp)"
    )
    parser.add_argument(
        "--wmdp-sample", type=int, default=None, help="E7's base accuracy on a seeded sample (0: skip it; default: all)"
    )
    parser.add_argument("--membership", action="store_true", help="E6: memorise-forget loaded vs evicted")
    parser.add_argument(
        "--plan", action="store_true", help="only say which adapters would be reused or trained, and why (no model)"
    )
    args = parser.parse_args(argv)
    if args.plan:
        return _print_plan(args.only)

    import torch
    from tqdm.auto import tqdm

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
            with tqdm(total=config.settings(entry).steps, desc=entry.id, unit="step", leave=False) as bar:

                def on_step(_id: str, _step: int, loss: float, bar: tqdm = bar) -> None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.3f}")

                row = lab.train(config, ids=[entry.id], on_step=on_step)[0]
            rows.append(row)
            state = "trained" if row["trained_now"] else "reused"
            line = f"  {entry.id:32s} {state:7s} {row['seconds']:7.1f} s  final loss {row['final_loss']:.3f}"
            print(line, flush=True)
        (out / "training.json").write_text(json.dumps(rows, indent=1))
    if not args.no_score:
        _score(lab, config, args.only, out)
    if args.membership:
        _membership(lab, out)
    if args.wmdp:
        _wmdp(lab, out, args.wmdp_sample)
    print(f"done in {time.perf_counter() - started:.0f} s; outputs in {out}")
    return 0


def _score(lab: AdapterLab, config: ZooConfig, only: list[str] | None, out: Path) -> None:
    """E4 + E5 over the zoo: every gate layer and influence per adapter, the evaluation table."""
    from rvu_pipelines.adapters.gate import evaluate_gate, load_gate_config
    from rvu_pipelines.adapters.report import gate_markdown
    from rvu_pipelines.adapters.study import influence_summary, scores_frame

    gate = load_gate_config()
    reference = lab.verify(gate.reference_adapter)
    scores = []
    for entry in config.adapters:
        if only is not None and entry.id not in only:
            continue
        score = lab.score(lab.verify(entry.id), reference, gate)
        scores.append(score)
        print(
            f"  {score.adapter_id:32s} {score.label:7s} projection {score.projection:+.4f} "
            f"safe-lora {score.safe_lora:.4f} "
            f"ood {score.ood:8.3f} behaviour {score.behaviour:+.3f} sensitive {score.sensitive:+.3f} "
            f"qa-drop {score.qa_drop:+.3f} influence {score.influence:.3f} ({score.gate_seconds:.1f} s gate)",
            flush=True,
        )
    frame = scores_frame(scores)
    frame.write_csv(out / "scores.csv")
    evaluation = evaluate_gate([s.gate_scores() for s in scores], gate.false_positive_budget)
    summary = {"gate": evaluation.to_dict(), "influence": influence_summary(scores)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    from rvu_pipelines.machine import results_stamp, stamp_line

    table = gate_markdown(evaluation, summary["influence"], frame)
    table += "\n" + stamp_line(results_stamp(" ".join(["python", *sys.argv]))) + "\n"
    (out / "gate.md").write_text(table)
    print(table)


if __name__ == "__main__":
    sys.exit(main())
