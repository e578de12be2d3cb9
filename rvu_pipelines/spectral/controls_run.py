"""The spectral switch under its controls: sink-free graphs, pairs as pairs, length, a probe, leave-one-set-out.

Sets: BIPIA, InjecAgent and AgentDojo tool outputs as (clean, injected, length-matched padded clean) triples;
deepset prompts (one per group, no pairs); TOFU context verification pairs (the seed's own task, no padding).
Whole groups only, each member at most ``max_tokens``. One forward pass per example gives the statistics of
every graph configuration (``config.GRAPH_CONFIGS``) and per-head graphs at a few layers; a second (the probe
prompt) gives Attention Tracker's per-head focus and the span's perplexity. Everything a decision uses is fitted
on the calibration split and read on the held-out split. Writes ``<out>/controls.md``, ``controls.json`` and
per-feature CSVs, stamped with the command, commit, date and machine; features are cached in ``<out>/cache``.
The ``spectral_controls`` asset runs it (``make spectral``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from rvu_pipelines.atomic_write import write_atomically, write_stream_atomically
from rvu_pipelines.spectral.errors import SpectralInputError
from rvu_pipelines.spectral.study_run import examples_digest, progress_reporter

PADDED_SETS = ("bipia", "injecagent", "agentdojo")
CONTAMINATION = ("bipia", "injecagent", "agentdojo", "deepset")
HEAD_LAYERS = (2, 8, 14, 20, 26)
CONTROL_SETS = ("bipia", "injecagent", "agentdojo", "deepset", "context_verification")
CONTROL_GRAPHS = ("seed_study", "sink_free", "sink_free_norm", "spectral_trust")


@dataclass(frozen=True)
class ControlsOptions:
    """``groups`` (pairs / triples) per set, 40 % held out; ``detectors``: D1-D5 beside the switch (training D2 /
    D4 on deepset takes minutes)."""

    sets: tuple[str, ...] = CONTROL_SETS
    graphs: tuple[str, ...] = CONTROL_GRAPHS
    groups: int = 40
    max_tokens: int = 384
    seed: int = 0
    detectors: bool = True


def control_frames(options: ControlsOptions, tokenizer: Any, sets: dict[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """Each set's whole groups within the token cap, ``groups`` of them split 60 / 40 calibration / held-out
    (``sets``: the spectral evaluation sets, ``data.spectral_sets``; AgentDojo's tool outputs join them here)."""
    from rvu_pipelines.spectral.data import keep_whole_groups, length_matched_clean
    from rvu_pipelines.spectral.study import limit_groups
    from rvu_pipelines.spectral.tool_outputs import agentdojo_tool_outputs

    sets = dict(sets)
    outputs = agentdojo_tool_outputs()
    sets["agentdojo"] = outputs.filter(pl.col("label").sum().over("group") == 1)
    unknown = sorted(set(options.sets) - set(sets))
    if unknown:
        raise ValueError(f"unknown control sets {unknown}; allowed values: {', '.join(sorted(sets))}")
    groups, seed = options.groups, options.seed
    out = {}
    for name in options.sets:
        frame = sets[name]
        if name in PADDED_SETS:
            frame = length_matched_clean(frame, seed=seed)
        frame = keep_whole_groups(frame, lambda text: len(tokenizer(text)["input_ids"]), options.max_tokens)
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


def run_controls(
    options: ControlsOptions,
    out: Path,
    *,
    command: str,
    frames: Mapping[str, pl.DataFrame] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The controls report into ``out`` (``command`` is what the stamp says produced it); returns the report.
    ``frames``: the parsed data sets by catalog name (``data.SOURCE_FRAMES``; default: read through the catalog)."""
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
    from rvu_pipelines.spectral.data import load_source_frames, spectral_sets
    from rvu_pipelines.spectral.probe import leave_one_dataset_out
    from rvu_pipelines.spectral.study import FeatureSet, extract_by_graph

    graphs = list(options.graphs)
    cache = out / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    model = load_profile_model()
    source_frames = frames if frames is not None else load_source_frames()
    frames = control_frames(options, model.tokenizer, spectral_sets(source_frames))
    features: dict[str, dict[str, FeatureSet]] = {}
    baselines: dict[str, BaselineFeatures] = {}
    for name, frame in frames.items():
        definitions = [asdict(graph_config(graph)) for graph in graphs]  # a changed definition recomputes
        digest = examples_digest(frame, repr((options.max_tokens, graphs, definitions, HEAD_LAYERS)))
        paths = {graph: cache / f"{name}_{graph}_{digest}.npz" for graph in graphs}
        if all(path.is_file() for path in paths.values()):
            features[name] = {graph: FeatureSet.load(str(path)) for graph, path in paths.items()}
            say(f"  {name}: cached features, {features[name][graphs[0]].seconds_per_example:.1f} s/example")
        else:
            computed = extract_by_graph(
                model,
                frame,
                graphs,
                name=name,
                max_tokens=options.max_tokens,
                head_layers=HEAD_LAYERS,
                progress=progress_reporter(say, name, 20),
            )
            features[name] = {graph: computed[("text", graph)] for graph in graphs}
            for graph, path in paths.items():
                features[name][graph].save(str(path))
        base_path = cache / f"{name}_baselines_{digest}.npz"
        if base_path.is_file():
            baselines[name] = BaselineFeatures.load(str(base_path))
        else:
            baselines[name] = extract_baselines(
                model,
                frame,
                name=name,
                max_tokens=options.max_tokens,
                progress=progress_reporter(say, f"{name} baselines", 20),
            )
            baselines[name].save(str(base_path))
    tracker = AttentionTracker.fit(model, synthetic_pairs(source_frames["tofu"]))

    report: dict[str, Any] = {
        "tracker": {"k": tracker.k, "heads": tracker.n_heads, "k_auroc": tracker.k_auroc},
        "switch": [],
        "best_feature": [],
        "attention_tracker": [],
        "detectors": [],
    }
    detectors = shipped_detectors() if options.detectors else {}
    for name in frames:
        for graph in graphs:
            feats = features[name][graph]
            report["switch"].append({"set": name, "graph": graph} | switch_controls(feats, seed=options.seed))
            table = feature_table(feats, seed=options.seed)
            write_stream_atomically(out / f"{name}_{graph}_features.csv", table.write_csv)
            top = float(table["beyond_length"].max())  # type: ignore[arg-type]
            report["best_feature"].append(
                {"set": name, "graph": graph, "top_beyond_length": top} | best_by_calibration(table)
            )
        tracker_scores = tracker.score_features(baselines[name])
        if np.isfinite(tracker_scores).all():
            report["attention_tracker"].append(
                {"set": name} | score_controls(tracker_scores, features[name][graphs[0]])
            )
        first = features[name][graphs[0]]
        for row in detector_controls(detectors, baselines[name].spans, first, seed=options.seed):
            report["detectors"].append({"set": name} | row)
    tests = {f"{r['set']}/{r['graph']}": r["paired_test"]["p_value"] for r in report["switch"] if "paired_test" in r}
    adjusted = holm(tests)
    for r in report["switch"]:
        r["holm_p"] = adjusted.get(f"{r['set']}/{r['graph']}")

    probe_sets = [name for name in frames if name in CONTAMINATION]
    if len(probe_sets) >= 2:
        blocks, labels, sources, groups, splits = [], [], [], [], []
        for name in probe_sets:
            first = features[name][graphs[0]]
            if first.groups is None:
                raise SpectralInputError(f"{name}: the features carry no groups; the probe splits by group")
            n = first.labels.size
            keep = first.roles != "padded" if first.roles is not None else np.ones(n, bool)
            base = baselines[name]
            parts = [features[name][g].values.reshape(n, -1) for g in graphs]
            if first.head_values is not None:
                parts.append(first.head_values.reshape(n, -1))
            parts.append(head_focus(base.instruction_attention, base.data_attention, "normalised").reshape(n, -1))
            blocks.append(np.nan_to_num(np.concatenate(parts, 1))[keep])
            labels.append(first.labels[keep])
            sources.append(np.full(int(keep.sum()), name))
            groups.append(np.char.add(f"{name}/", first.groups[keep].astype(str)))
            splits.append(first.splits[keep])
        lodo = leave_one_dataset_out(
            np.concatenate(blocks),
            np.concatenate(labels),
            np.concatenate(sources),
            np.concatenate(groups),
            np.concatenate(splits),
            seed=options.seed,
        )
        report["probe_lodo"] = [r.as_dict() for r in lodo]

    report["stamp"] = results_stamp(command)
    report["stamp_line"] = stamp_line(report["stamp"])
    markdown = render_controls(report)
    write_atomically(out / "controls.md", markdown)
    write_atomically(out / "controls.json", json.dumps(report, indent=2, default=str) + "\n")
    say(markdown)
    return report
