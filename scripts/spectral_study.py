"""The spectral kill-switch study (seed 004, issue 14): features, per-layer AUROC, 20/50/200 calibration, plots.

    .venv/bin/python scripts/spectral_study.py                      # every set, up to 400 examples each
    .venv/bin/python scripts/spectral_study.py --sets context_verification --limit 120

Features are cached in <out>/<set>_<scope>.npz (delete them to recompute); plots and tables go to <out>.
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="*", default=["context_verification", "bipia", "injecagent", "deepset"])
    parser.add_argument("--limit", type=int, default=400, help="examples per set (whole pairs)")
    parser.add_argument("--scopes", nargs="*", choices=["text", "document"], default=["text", "document"])
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--draws", type=int, default=20, help="calibration draws per size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=".rvu/spectral")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from rvu_pipelines.spectral import load_profile_model
    from rvu_pipelines.spectral.data import load_spectral_datasets

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    datasets = load_spectral_datasets()
    model = None
    report: dict[str, object] = {}
    calibration_tables = []
    for name in args.sets:
        caches = {scope: out / f"{name}_{scope}.npz" for scope in args.scopes}
        if all(cache.is_file() for cache in caches.values()):
            by_scope = {scope: FeatureSet.load(str(cache)) for scope, cache in caches.items()}
        else:
            model = model or load_profile_model()
            frame = limit_groups(datasets[name], args.limit)
            started = time.perf_counter()

            def progress(i: int, n: int, name: str = name, started: float = started) -> None:
                if i % 50 == 0:
                    print(f"  {name}: {i}/{n} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

            by_scope = extract_features(
                model, frame, name=name, scopes=args.scopes, max_tokens=args.max_tokens, progress=progress
            )
            for scope, features in by_scope.items():
                features.save(str(caches[scope]))
        for scope, features in by_scope.items():
            features.settings["scope"] = scope
            report[f"{name}/{scope}"], calibration = _report_set(features, args, out)
            calibration_tables.append(calibration)
    if calibration_tables:
        pl.concat(calibration_tables, how="diagonal").write_csv(out / "calibration.csv")
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    print(f"\nwritten to {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
