"""The spectral switch under its controls: sink-free graphs, pairs as pairs, length, a probe, leave-one-set-out.

    .venv/bin/python scripts/spectral_controls.py                     # 40 groups per set, every graph config
    .venv/bin/python scripts/spectral_controls.py --groups 12 --sets bipia injecagent --out /tmp/sc

Sets: BIPIA, InjecAgent and AgentDojo tool outputs as (clean, injected, length-matched padded clean) triples;
deepset prompts (one per group, no pairs); TOFU context verification pairs (the seed's own task, no padding).
Whole groups only, each member ≤ --max-tokens. One forward pass per example gives the statistics of every
graph configuration (``config.GRAPH_CONFIGS``) and per-head graphs at a few layers; a second (the probe prompt)
gives Attention Tracker's per-head focus and the span's perplexity. Everything a decision uses is fitted on the
calibration split and read on the held-out split. Writes ``<out>/controls.md``, ``controls.json`` and per-feature
CSVs, stamped with the command, commit, date and machine; features are cached in ``<out>/cache``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

PADDED_SETS = ("bipia", "injecagent", "agentdojo")
CONTAMINATION = ("bipia", "injecagent", "agentdojo", "deepset")
HEAD_LAYERS = (2, 8, 14, 20, 26)


def _frames(names: list[str], groups: int, max_tokens: int, tokenizer: Any, seed: int) -> dict[str, pl.DataFrame]:
    from rvu_pipelines.spectral.data import keep_whole_groups, length_matched_clean, load_spectral_datasets
    from rvu_pipelines.spectral.study import limit_groups
    from rvu_pipelines.spectral.tool_outputs import agentdojo_tool_outputs

    sets = load_spectral_datasets()
    outputs = agentdojo_tool_outputs()
    paired = outputs.filter(pl.col("label").sum().over("group") == 1)
    sets["agentdojo"] = paired
    out = {}
    for name in names:
        frame = sets[name]
        if name in PADDED_SETS:
            frame = length_matched_clean(frame, seed=seed)
        frame = keep_whole_groups(frame, lambda text: len(tokenizer(text)["input_ids"]), max_tokens)
        per_group = max(1, int(frame.group_by("group").len()["len"].max()))  # type: ignore[arg-type]
        parts = []
        for split, share in (("calibration", groups - groups * 2 // 5), ("heldout", groups * 2 // 5)):
            part = frame.filter(pl.col("split") == split)
            if per_group == 1:  # no pairs (deepset): half of each class
                parts += [
                    limit_groups(part.filter(pl.col("label") == y), share // 2 + y * (share % 2), seed) for y in (0, 1)
                ]
            else:
                parts.append(limit_groups(part, per_group * share, seed))
        out[name] = pl.concat(parts)
    return out


def _digest(frame: pl.DataFrame, *parts: object) -> str:
    h = hashlib.sha256(repr(parts).encode())
    for text, split in zip(frame["text"].to_list(), frame["split"].to_list(), strict=True):
        h.update(f"{split}\0{text}\0".encode())
    return h.hexdigest()[:12]


def _progress(name: str, started: float):  # type: ignore[no-untyped-def]
    def report(i: int, n: int) -> None:
        if i % 20 == 0:
            print(f"  {name}: {i}/{n} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sets", nargs="*", default=["bipia", "injecagent", "agentdojo", "deepset", "context_verification"]
    )
    parser.add_argument("--graphs", nargs="*", default=["seed_study", "sink_free", "sink_free_norm", "spectral_trust"])
    parser.add_argument("--groups", type=int, default=40, help="groups (pairs / triples) per set, 40 %% held out")
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-detectors",
        dest="detectors",
        action="store_false",
        help="skip D1–D5 (training D2 / D4 on deepset takes minutes)",
    )
    parser.add_argument("--out", default=".rvu/spectral/controls")
    args = parser.parse_args(argv)  # fmt: skip

    import torch

    torch.set_num_threads(args.threads)
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset
    from rvu_pipelines.machine import results_stamp, stamp_line
    from rvu_pipelines.spectral import load_profile_model
    from rvu_pipelines.spectral.attention_tracker import head_focus
    from rvu_pipelines.spectral.baselines import AttentionTracker, BaselineFeatures, extract_baselines, synthetic_pairs
    from rvu_pipelines.spectral.comparison import shipped_detectors
    from rvu_pipelines.spectral.config import graph_config
    from rvu_pipelines.spectral.controls import (
        best_by_calibration,
        detector_controls,
        feature_table,
        score_controls,
        switch_controls,
    )
    from rvu_pipelines.spectral.controls_report import holm, render_controls
    from rvu_pipelines.spectral.probe import leave_one_dataset_out
    from rvu_pipelines.spectral.study import FeatureSet, extract_by_graph

    out, cache = Path(args.out), Path(args.out) / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    model = load_profile_model()
    frames = _frames(args.sets, args.groups, args.max_tokens, model.tokenizer, args.seed)
    features: dict[str, dict[str, FeatureSet]] = {}
    baselines: dict[str, BaselineFeatures] = {}
    for name, frame in frames.items():
        definitions = [asdict(graph_config(graph)) for graph in args.graphs]  # a changed definition recomputes
        digest = _digest(frame, args.max_tokens, args.graphs, definitions, HEAD_LAYERS)
        paths = {graph: cache / f"{name}_{graph}_{digest}.npz" for graph in args.graphs}
        if all(path.is_file() for path in paths.values()):
            features[name] = {graph: FeatureSet.load(str(path)) for graph, path in paths.items()}
            print(f"  {name}: cached features, {features[name][args.graphs[0]].seconds_per_example:.1f} s/example",
                  file=sys.stderr)  # fmt: skip
        else:
            progress = _progress(name, time.perf_counter())
            computed = extract_by_graph(model, frame, args.graphs, name=name, max_tokens=args.max_tokens,
                                        head_layers=HEAD_LAYERS, progress=progress)  # fmt: skip
            features[name] = {graph: computed[("text", graph)] for graph in args.graphs}
            for graph, path in paths.items():
                features[name][graph].save(str(path))
        base_path = cache / f"{name}_baselines_{digest}.npz"
        if base_path.is_file():
            baselines[name] = BaselineFeatures.load(str(base_path))
        else:
            progress = _progress(f"{name} baselines", time.perf_counter())
            baselines[name] = extract_baselines(model, frame, name=name, max_tokens=args.max_tokens,
                                                progress=progress)  # fmt: skip
            baselines[name].save(str(base_path))
    tofu = load_dataset(load_catalog().get("tofu"), default_dataset_source()).frame
    tracker = AttentionTracker.fit(model, synthetic_pairs(tofu))

    report: dict[str, Any] = {
        "tracker": {"k": tracker.k, "heads": tracker.n_heads, "k_auroc": tracker.k_auroc},
        "switch": [],
        "best_feature": [],
        "attention_tracker": [],
        "detectors": [],
    }
    detectors = shipped_detectors() if args.detectors else {}
    for name in frames:
        for graph in args.graphs:
            feats = features[name][graph]
            report["switch"].append({"set": name, "graph": graph} | switch_controls(feats, seed=args.seed))
            table = feature_table(feats, seed=args.seed)
            table.write_csv(out / f"{name}_{graph}_features.csv")
            top = float(table["beyond_length"].max())
            report["best_feature"].append(
                {"set": name, "graph": graph, "top_beyond_length": top} | best_by_calibration(table)
            )
        tracker_scores = tracker.score_features(baselines[name])
        if np.isfinite(tracker_scores).all():
            report["attention_tracker"].append(
                {"set": name} | score_controls(tracker_scores, features[name][args.graphs[0]])
            )
        for row in detector_controls(detectors, baselines[name].spans, features[name][args.graphs[0]], seed=args.seed):
            report["detectors"].append({"set": name} | row)
    tests = {f"{r['set']}/{r['graph']}": r["paired_test"]["p_value"] for r in report["switch"] if "paired_test" in r}
    adjusted = holm(tests)
    for r in report["switch"]:
        r["holm_p"] = adjusted.get(f"{r['set']}/{r['graph']}")

    probe_sets = [name for name in frames if name in CONTAMINATION]
    if len(probe_sets) >= 2:
        blocks, labels, sources, groups, splits = [], [], [], [], []
        for name in probe_sets:
            first = features[name][args.graphs[0]]
            n = first.labels.size
            keep = first.roles != "padded" if first.roles is not None else np.ones(n, bool)
            base = baselines[name]
            parts = [features[name][g].values.reshape(n, -1) for g in args.graphs]
            if first.head_values is not None:
                parts.append(first.head_values.reshape(n, -1))
            parts.append(head_focus(base.instruction_attention, base.data_attention, "normalised").reshape(n, -1))
            blocks.append(np.nan_to_num(np.concatenate(parts, 1))[keep])
            labels.append(first.labels[keep])
            sources.append(np.full(int(keep.sum()), name))
            groups.append(np.char.add(f"{name}/", first.groups[keep].astype(str)))
            splits.append(first.splits[keep])
        lodo = leave_one_dataset_out(np.concatenate(blocks), np.concatenate(labels), np.concatenate(sources),
                                     np.concatenate(groups), np.concatenate(splits), seed=args.seed)  # fmt: skip
        report["probe_lodo"] = [r.as_dict() for r in lodo]

    command = ["python scripts/spectral_controls.py", *(argv if argv is not None else sys.argv[1:])]
    report["stamp"] = results_stamp(" ".join(command))
    report["stamp_line"] = stamp_line(report["stamp"])
    markdown = render_controls(report)
    (out / "controls.md").write_text(markdown, encoding="utf-8")
    (out / "controls.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
