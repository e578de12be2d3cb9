"""The spectral kill-switch study in full (seed 004): features, per-layer AUROC, 20/50/200 calibration, plots, and
the comparison with the baselines on the same held-out splits.

Features are cached in ``<out>/<set>_<scope>_<graph>_<digest>.npz``, the digest naming the examples and settings
(delete them to recompute); plots and tables go to ``<out>``. Unless ``comparison`` is off, the baselines
(Attention Tracker, perplexity, D1-D5 as shipped) are scored on the same held-out splits and the comparison /
leave-one-dataset-out table is written to ``<out>/comparison.md``. The ``spectral_study`` asset runs it
(``make spectral``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from rvu_pipelines.atomic_write import write_atomically, write_stream_atomically
from rvu_pipelines.spectral.study import FeatureSet, extract_features, limit_groups

Say = Callable[[str], None]
STUDY_SETS = ("context_verification", "bipia", "injecagent", "deepset")


@dataclass(frozen=True)
class StudyOptions:
    """What the full study computes: ``limit`` examples per set (whole pairs), ``limits`` per set by name."""

    sets: tuple[str, ...] = STUDY_SETS
    limit: int = 400
    limits: Mapping[str, int] = field(default_factory=dict)
    scopes: tuple[str, ...] = ("text", "document")
    max_tokens: int = 384
    graph: str = "sink_free"
    draws: int = 20
    comparison: bool = True

    def limit_for(self, name: str) -> int:
        return int(self.limits.get(name, self.limit))


def examples_digest(frame: pl.DataFrame, settings: str) -> str:
    """Names a feature cache by what it was computed from: ``settings`` (what else the features depend on),
    then the examples' splits and texts in order."""
    h = hashlib.sha256(settings.encode())
    for text, split in zip(frame["text"].to_list(), frame["split"].to_list(), strict=True):
        h.update(f"{split}\0{text}\0".encode())
    return h.hexdigest()[:12]


def feature_digest(frame: pl.DataFrame, max_tokens: int) -> str:
    """The study's feature caches: the examples and the length cap."""
    return examples_digest(frame, f"max_tokens={max_tokens}\n")


def progress_reporter(say: Say, name: str, every: int) -> Callable[[int, int], None]:
    """A ``progress(i, n)`` callback that says how far one extraction got, every ``every`` examples."""
    started = time.perf_counter()

    def report(i: int, n: int) -> None:
        if i % every == 0:
            say(f"  {name}: {i}/{n} ({time.perf_counter() - started:.0f} s)")

    return report


def report_set(
    features: FeatureSet, options: StudyOptions, out: Path, say: Say
) -> tuple[dict[str, object], pl.DataFrame]:
    """Per-layer held-out AUROC, histograms and the 20/50/200 calibration comparison of one feature set."""
    from rvu_pipelines.spectral import STAT_NAMES
    from rvu_pipelines.spectral.killswitch import calibrate, orientation_and_auroc
    from rvu_pipelines.spectral.plots import layer_histograms
    from rvu_pipelines.spectral.study import (
        best_heldout,
        calibration_comparison,
        per_layer_auroc,
        summarise_calibration,
    )
    from rvu_pipelines.spectral.uncertainty import auroc_estimate

    scope = str(features.settings.get("scope", "text"))
    tag = f"{features.name}_{scope}"
    held_x, held_y = features.part("heldout")
    cal_x, cal_y = features.part("calibration")
    say(
        f"\n== {features.name} ({scope}): {features.labels.size} examples kept, {features.skipped} skipped "
        f"(> {options.max_tokens} tokens); calibration {cal_y.size}, held-out {held_y.size}; "
        f"{features.seconds_per_example:.2f} s/example"
    )
    table = pl.DataFrame([row for statistic in STAT_NAMES for row in per_layer_auroc(held_x, held_y, statistic)])
    write_stream_atomically(out / f"{tag}_per_layer.csv", table.write_csv)
    say("held-out AUROC per layer, HFER (direction chosen on the held-out labels: optimistic):")
    for row in table.filter(pl.col("statistic") == "hfer").iter_rows(named=True):
        say(
            f"  layer {row['layer']:2d}: {row['auroc']:.3f} [{row['low']:.3f}, {row['high']:.3f}] "
            f"mean fire {row['mean_fire']:.3f} / pass {row['mean_pass']:.3f}"
        )
    best = best_heldout(held_x, held_y)
    say(f"best single feature on held-out (optimistic): {best}")
    length = features.n_tokens[features.splits == "heldout"].astype(np.float64)
    length_direction, _ = orientation_and_auroc(length, held_y)
    length_auroc = auroc_estimate(held_y, length_direction * length)
    say(f"token count alone (the length confound), held-out AUROC: {length_auroc}")
    full = calibrate(cal_x, cal_y)
    threshold = (full.layer, full.direction * full.threshold)
    layer_histograms(
        features.values,
        features.labels,
        out / f"{tag}_hfer_hist.png",
        statistic="hfer",
        title=f"{features.name} ({scope}): HFER per layer (blue pass, red fire), n={features.labels.size}",
        threshold=threshold if full.statistic == "hfer" else None,
    )
    layer_histograms(
        features.values,
        features.labels,
        out / f"{tag}_{full.statistic}_hist.png",
        statistic=full.statistic,
        title=f"{features.name} ({scope}): {full.statistic} per layer; switch at layer {full.layer}",
        threshold=threshold,
    )
    calibration = calibration_comparison(features, draws=options.draws).with_columns(pl.lit(scope).alias("scope"))
    say(str(summarise_calibration(calibration)))
    return {
        "n": int(features.labels.size),
        "skipped": features.skipped,
        "n_calibration": int(cal_y.size),
        "n_heldout": int(held_y.size),
        "seconds_per_example": features.seconds_per_example,
        "best_heldout_optimistic": best,
        "token_count_auroc": length_auroc.as_dict(),
        "switch_full_calibration": full.as_dict(),
    }, calibration


def run_comparison(
    frames: dict[str, pl.DataFrame],
    spectral: dict[str, FeatureSet],
    options: StudyOptions,
    out: Path,
    model_loader: Callable[[], Any],
    say: Say,
    tofu: pl.DataFrame,
) -> pl.DataFrame:
    """Baselines on the same examples, then the comparison / leave-one-dataset-out table (the Attention Tracker
    fitted on synthetic pairs from ``tofu``)."""
    from rvu_pipelines.spectral.baselines import AttentionTracker, BaselineFeatures, extract_baselines, synthetic_pairs
    from rvu_pipelines.spectral.comparison import SetFeatures, comparison_table, markdown_table, shipped_detectors

    sets = {}
    for name, frame in frames.items():
        cache = out / f"{name}_baselines_{feature_digest(frame, options.max_tokens)}.npz"
        if cache.is_file():
            baselines = BaselineFeatures.load(str(cache))
        else:
            baselines = extract_baselines(
                model_loader(),
                frame,
                name=name,
                max_tokens=options.max_tokens,
                progress=progress_reporter(say, f"{name} baselines", 50),
            )
            baselines.save(str(cache))
        sets[name] = SetFeatures(spectral[name], baselines)
    pairs = synthetic_pairs(tofu)
    trackers = [AttentionTracker.fit(model_loader(), pairs, mode=mode) for mode in ("normalised", "raw")]
    for tracker in trackers:
        say(
            f"Attention Tracker ({tracker.mode}): k={tracker.k:g}, {tracker.n_heads} important heads of "
            f"{tracker.heads.size} from {tracker.n_pairs} pairs"
        )
    table = comparison_table(sets, trackers, shipped_detectors(), draws=options.draws)
    write_stream_atomically(out / "comparison.csv", table.write_csv)
    markdown = markdown_table(table, list(sets))
    write_atomically(out / "comparison.md", markdown + "\n")
    say("\nheld-out AUROC [95 % CI] per method and evaluation set (bold: best not calibrated on that source):")
    say(markdown)
    return table


def run_study(
    options: StudyOptions,
    out: Path,
    *,
    frames: Mapping[str, pl.DataFrame] | None = None,
    say: Say = print,
) -> dict[str, object]:
    """The full study into ``out``; returns the report written to ``<out>/report.json``. ``frames``: the parsed
    data sets by catalog name (``data.SOURCE_FRAMES``; default: read through the catalog)."""
    from rvu_pipelines.spectral import load_profile_model
    from rvu_pipelines.spectral.data import load_source_frames, spectral_sets

    out.mkdir(parents=True, exist_ok=True)
    frames = frames if frames is not None else load_source_frames()
    datasets = spectral_sets(frames)
    unknown = sorted(set(options.sets) - set(datasets))
    if unknown:
        raise ValueError(f"unknown spectral sets {unknown}; allowed values: {', '.join(sorted(datasets))}")
    loaded: list[Any] = []

    def model_loader() -> Any:
        if not loaded:
            loaded.append(load_profile_model())
        return loaded[0]

    report: dict[str, object] = {}
    calibration_tables = []
    examples, text_features = {}, {}
    for name in options.sets:
        frame = limit_groups(datasets[name], options.limit_for(name))
        examples[name] = frame
        digest = feature_digest(frame, options.max_tokens)
        caches = {scope: out / f"{name}_{scope}_{options.graph}_{digest}.npz" for scope in options.scopes}
        if all(cache.is_file() for cache in caches.values()):
            by_scope = {scope: FeatureSet.load(str(cache)) for scope, cache in caches.items()}
        else:
            by_scope = extract_features(
                model_loader(),
                frame,
                name=name,
                scopes=list(options.scopes),
                max_tokens=options.max_tokens,
                graph=options.graph,
                progress=progress_reporter(say, name, 50),
            )
            for scope, features in by_scope.items():
                features.save(str(caches[scope]))
        for scope, features in by_scope.items():
            features.settings["scope"] = scope
            report[f"{name}/{scope}"], calibration = report_set(features, options, out, say)
            calibration_tables.append(calibration)
        if "text" in by_scope:
            text_features[name] = by_scope["text"]
    if calibration_tables:
        write_stream_atomically(out / "calibration.csv", pl.concat(calibration_tables, how="diagonal").write_csv)
    write_atomically(out / "report.json", json.dumps(report, indent=2, default=str))
    if options.comparison and text_features:
        chosen = {n: examples[n] for n in text_features}
        run_comparison(chosen, text_features, options, out, model_loader, say, frames["tofu"])
    say(f"\nwritten to {out}/")
    return report
