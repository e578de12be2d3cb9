"""The spectral kill-switch study (seed 004): features, per-layer AUROC, 20/50/200 calibration, plots.

    .venv/bin/python scripts/spectral_study.py                      # every set, up to 400 examples each
    .venv/bin/python scripts/spectral_study.py --sets context_verification --limit 120

Features are cached in <out>/<set>_<scope>_<digest>.npz, the digest naming the examples and settings (delete
them to recompute); plots and tables go to <out>. Unless --no-comparison, the baselines (Attention Tracker,
perplexity, D1–D5 as shipped) are scored on the same held-out splits and the comparison / leave-one-dataset-out
table is printed and written to <out>/comparison.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

from rvu_pipelines.spectral.study import FeatureSet, extract_features, limit_groups


def _report_set(features: FeatureSet, args: argparse.Namespace, out: Path) -> tuple[dict[str, object], pl.DataFrame]:
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
    print(
        f"\n== {features.name} ({scope}): {features.labels.size} examples kept, {features.skipped} skipped "
        f"(> {args.max_tokens} tokens); calibration {cal_y.size}, held-out {held_y.size}; "
        f"{features.seconds_per_example:.2f} s/example"
    )
    table = pl.DataFrame([row for statistic in STAT_NAMES for row in per_layer_auroc(held_x, held_y, statistic)])
    table.write_csv(out / f"{tag}_per_layer.csv")
    print("held-out AUROC per layer, HFER (direction chosen on the held-out labels: optimistic):")
    for row in table.filter(pl.col("statistic") == "hfer").iter_rows(named=True):
        print(
            f"  layer {row['layer']:2d}: {row['auroc']:.3f} [{row['low']:.3f}, {row['high']:.3f}] "
            f"mean fire {row['mean_fire']:.3f} / pass {row['mean_pass']:.3f}"
        )
    best = best_heldout(held_x, held_y)
    print(f"best single feature on held-out (optimistic): {best}")
    length = features.n_tokens[features.splits == "heldout"].astype(np.float64)
    length_direction, _ = orientation_and_auroc(length, held_y)
    length_auroc = auroc_estimate(held_y, length_direction * length)
    print(f"token count alone (the length confound), held-out AUROC: {length_auroc}")
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
    calibration = calibration_comparison(features, draws=args.draws).with_columns(pl.lit(scope).alias("scope"))
    print(summarise_calibration(calibration))
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


def _limit(limits: list[str], name: str) -> int:
    """``--limit 400 bipia=300``: the per-set value if given, else the bare number."""
    default, named = 400, {}
    for item in limits:
        key, _, value = item.rpartition("=")
        if not value.isdigit():
            raise SystemExit(f"--limit {item!r}: use N or SET=N with N a whole number")
        if key:
            named[key] = int(value)
        else:
            default = int(value)
    return named.get(name, default)


def _digest(frame: pl.DataFrame, max_tokens: int) -> str:
    """Names a feature cache by what it was computed from: the examples' texts and splits and the length cap."""
    h = hashlib.sha256(f"max_tokens={max_tokens}\n".encode())
    for text, split in zip(frame["text"].to_list(), frame["split"].to_list(), strict=True):
        h.update(f"{split}\0{text}\0".encode())
    return h.hexdigest()[:12]


def _comparison(
    frames: dict[str, pl.DataFrame], spectral: dict[str, FeatureSet], args: argparse.Namespace, out: Path, model_loader
) -> None:  # type: ignore[no-untyped-def]
    """Baselines on the same examples, then the comparison / leave-one-dataset-out table."""
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset
    from rvu_pipelines.spectral.baselines import AttentionTracker, BaselineFeatures, extract_baselines, synthetic_pairs
    from rvu_pipelines.spectral.comparison import SetFeatures, comparison_table, markdown_table, shipped_detectors

    sets = {}
    for name, frame in frames.items():
        cache = out / f"{name}_baselines_{_digest(frame, args.max_tokens)}.npz"
        if cache.is_file():
            baselines = BaselineFeatures.load(str(cache))
        else:
            started = time.perf_counter()

            def progress(i: int, n: int, name: str = name, started: float = started) -> None:
                if i % 50 == 0:
                    print(f"  {name} baselines: {i}/{n} ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
                          flush=True)  # fmt: skip

            baselines = extract_baselines(model_loader(), frame, name=name, max_tokens=args.max_tokens,
                                          progress=progress)  # fmt: skip
            baselines.save(str(cache))
        sets[name] = SetFeatures(spectral[name], baselines)
    tofu = load_dataset(load_catalog().get("tofu"), default_dataset_source()).frame
    pairs = synthetic_pairs(tofu)
    trackers = [AttentionTracker.fit(model_loader(), pairs, mode=mode) for mode in ("normalised", "raw")]
    for tracker in trackers:
        print(f"Attention Tracker ({tracker.mode}): k={tracker.k:g}, {tracker.n_heads} important heads of "
              f"{tracker.heads.size} from {tracker.n_pairs} pairs")  # fmt: skip
    table = comparison_table(sets, trackers, shipped_detectors(), draws=args.draws)
    table.write_csv(out / "comparison.csv")
    markdown = markdown_table(table, list(sets))
    (out / "comparison.md").write_text(markdown + "\n", encoding="utf-8")
    print("\nheld-out AUROC [95 % CI] per method and evaluation set (bold: best not calibrated on that source):")
    print(markdown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="*", default=["context_verification", "bipia", "injecagent", "deepset"])
    parser.add_argument(
        "--limit",
        nargs="*",
        default=["400"],
        help="examples per set (whole pairs): N for every set, and/or SET=N for one (e.g. 400 bipia=300)",
    )
    parser.add_argument("--scopes", nargs="*", choices=["text", "document"], default=["text", "document"])
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--graph", default="sink_free", help="graph configuration (config.GRAPH_CONFIGS)")
    parser.add_argument("--draws", type=int, default=20, help="calibration draws per size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=".rvu/spectral")
    parser.add_argument("--no-comparison", action="store_true", help="skip the baselines and the comparison table")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from rvu_pipelines.spectral import load_profile_model
    from rvu_pipelines.spectral.data import load_spectral_datasets

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    datasets = load_spectral_datasets()
    loaded: list[object] = []

    def model_loader():  # type: ignore[no-untyped-def]
        if not loaded:
            loaded.append(load_profile_model())
        return loaded[0]

    report: dict[str, object] = {}
    calibration_tables = []
    frames, text_features = {}, {}
    for name in args.sets:
        frame = limit_groups(datasets[name], _limit(args.limit, name))
        frames[name] = frame
        digest = _digest(frame, args.max_tokens)
        caches = {scope: out / f"{name}_{scope}_{args.graph}_{digest}.npz" for scope in args.scopes}
        if all(cache.is_file() for cache in caches.values()):
            by_scope = {scope: FeatureSet.load(str(cache)) for scope, cache in caches.items()}
        else:
            model = model_loader()
            started = time.perf_counter()

            def progress(i: int, n: int, name: str = name, started: float = started) -> None:
                if i % 50 == 0:
                    print(f"  {name}: {i}/{n} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

            by_scope = extract_features(
                model,
                frame,
                name=name,
                scopes=args.scopes,
                max_tokens=args.max_tokens,
                graph=args.graph,
                progress=progress,
            )
            for scope, features in by_scope.items():
                features.save(str(caches[scope]))
        for scope, features in by_scope.items():
            features.settings["scope"] = scope
            report[f"{name}/{scope}"], calibration = _report_set(features, args, out)
            calibration_tables.append(calibration)
        if "text" in by_scope:
            text_features[name] = by_scope["text"]
    if calibration_tables:
        pl.concat(calibration_tables, how="diagonal").write_csv(out / "calibration.csv")
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    if not args.no_comparison and text_features:
        _comparison({n: frames[n] for n in text_features}, text_features, args, out, model_loader)
    print(f"\nwritten to {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
