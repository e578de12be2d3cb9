"""The kill switch against its baselines on the same held-out splits, and the leave-one-dataset-out table.

Every method is scored on each evaluation set's held-out split only (nothing calibrates on it):

* **HFER switch, same source**: calibrated (layer, statistic, Bayes threshold) on 20 examples of the set's
  own calibration split (mean and 5–95 % range over 20 stratified draws), and on all of it (bootstrap CI).
* **HFER switch, other source** (leave-one-dataset-out): calibrated on all of one contamination source's
  calibration split, tested on each other source's held-out split.
* **Zero-shot / fixed** methods, one number per set: Attention Tracker (heads and k from 30 synthetic
  pairs; the published normalised focus score, and the raw instruction attention when that tracker is given),
  the LLM's perplexity of the span, and the platform's detectors as shipped — D1 regex, D2 TF-IDF and
  D4 MiniLM trained on deepset's training split (so deepset's held-out = deepset's published test split is
  in-distribution for them and out-of-distribution for everything else), D3 NanoGuard, D5 = 0.4·D2 + 0.6·D4.

AUROC throughout (threshold-free; the switch's TPR/FPR at its threshold are in the calibration table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from rvu_pipelines.spectral.baselines import AttentionTracker, BaselineFeatures
from rvu_pipelines.spectral.errors import CalibrationError, SpectralInputError
from rvu_pipelines.spectral.killswitch import calibrate
from rvu_pipelines.spectral.study import FeatureSet, calibration_comparison
from rvu_pipelines.spectral.uncertainty import auroc_estimate

CONTAMINATION_SETS: tuple[str, ...] = ("bipia", "injecagent", "deepset")
SAME_20 = "HFER switch, 20 examples of the same source"
SAME_ALL = "HFER switch, all calibration examples of the same source"
ATTENTION_TRACKER = "Attention Tracker (heads from 30 synthetic pairs)"
ATTENTION_TRACKER_RAW = "Attention Tracker, raw instruction attention (heads from 30 synthetic pairs)"
PERPLEXITY = "perplexity of the span (LLM)"
COLUMNS = ("method", "calibrated_on", "set", "auroc", "low", "high", "n")


@dataclass(frozen=True)
class SetFeatures:
    """One evaluation set's spectral features and baseline features, checked to describe the same examples."""

    spectral: FeatureSet
    baselines: BaselineFeatures

    def __post_init__(self) -> None:
        a, b = self.spectral, self.baselines
        if not (np.array_equal(a.labels, b.labels) and np.array_equal(a.splits, b.splits)):
            raise SpectralInputError(
                f"The spectral and baseline features of '{a.name}' describe different examples "
                f"({a.labels.size} vs {b.labels.size}); recompute both with the same --limit and --max-tokens."
            )

    def heldout(self) -> np.ndarray:
        return self.spectral.splits == "heldout"


def _row(method: str, calibrated_on: str, name: str, labels: np.ndarray, scores: np.ndarray) -> dict[str, object]:
    finite = np.isfinite(scores)
    if not finite.all() or len(set(labels.tolist())) < 2:
        return {"method": method, "calibrated_on": calibrated_on, "set": name, "auroc": float("nan"),
                "low": float("nan"), "high": float("nan"), "n": int(labels.size)}  # fmt: skip
    estimate = auroc_estimate(labels, scores, resamples=1000)
    return {"method": method, "calibrated_on": calibrated_on, "set": name, "auroc": estimate.value,
            "low": estimate.low, "high": estimate.high, "n": estimate.n}  # fmt: skip


def switch_rows(sets: Mapping[str, SetFeatures], draws: int = 20) -> list[dict[str, object]]:
    """The HFER switch calibrated on each source and tested on every source's held-out split."""
    rows = []
    for name, features in sets.items():
        table = calibration_comparison(features.spectral, sizes=(20,), draws=draws)
        if table.height:
            values = table["heldout_auroc"].to_numpy()
            rows.append({"method": SAME_20, "calibrated_on": name, "set": name, "auroc": float(values.mean()),
                         "low": float(np.quantile(values, 0.05)), "high": float(np.quantile(values, 0.95)),
                         "n": int(table["n_heldout"][0])})  # fmt: skip
    for source, calibration in sets.items():
        cal_x, cal_y = calibration.spectral.part("calibration")
        try:
            switch = calibrate(cal_x, cal_y)
        except CalibrationError:
            continue
        for name, target in sets.items():
            if name != source and (source not in CONTAMINATION_SETS or name not in CONTAMINATION_SETS):
                continue  # context verification and contamination are different tasks
            held_x, held_y = target.spectral.part("heldout")
            method = SAME_ALL if name == source else f"HFER switch calibrated on {source}"
            rows.append(_row(method, source, name, held_y, switch.score(held_x)))
    return rows


def fixed_rows(
    sets: Mapping[str, SetFeatures],
    tracker: AttentionTracker | Sequence[AttentionTracker],
    detectors: Mapping[str, object],
) -> list[dict[str, object]]:
    """Methods with no per-source calibration: Attention Tracker (one row per tracker given: normalised
    and / or raw), perplexity, D1–D5 as shipped."""
    rows = []
    for name, features in sets.items():
        mask = features.heldout()
        labels = features.spectral.labels[mask]
        base = features.baselines
        for one in [tracker] if isinstance(tracker, AttentionTracker) else tracker:
            method = ATTENTION_TRACKER if one.mode == "normalised" else ATTENTION_TRACKER_RAW
            rows.append(_row(method, "synthetic pairs", name, labels, one.score_features(base, mask)))
        rows.append(_row(PERPLEXITY, "none", name, labels, base.span_nll[mask]))
        spans = base.spans[mask].tolist()
        for label, detector in detectors.items():
            scores = np.asarray(detector.score(spans), dtype=np.float64)  # type: ignore[attr-defined]
            rows.append(_row(label, "shipped", name, labels, scores))
    return rows


def comparison_table(
    sets: Mapping[str, SetFeatures],
    tracker: AttentionTracker | Sequence[AttentionTracker],
    detectors: Mapping[str, object],
    draws: int = 20,
) -> pl.DataFrame:
    rows = switch_rows(sets, draws) + fixed_rows(sets, tracker, detectors)
    return pl.DataFrame(rows).select(COLUMNS)


def _cell(row: dict[str, object] | None) -> str:
    if row is None:
        return "—"
    auroc = float(row["auroc"])  # type: ignore[arg-type]
    if not np.isfinite(auroc):
        return "n/a"
    return f"{auroc:.3f} [{float(row['low']):.2f}, {float(row['high']):.2f}]"  # type: ignore[arg-type]


def markdown_table(table: pl.DataFrame, sets: Sequence[str]) -> str:
    """Methods × sets, AUROC [95 % CI] (for the 20-example rows: mean [5th, 95th percentile] over draws);
    the best value per set among the rows that did not calibrate on that set's source is in bold."""
    methods = list(dict.fromkeys(table["method"].to_list()))
    lookup = {(r["method"], r["set"]): r for r in table.iter_rows(named=True)}
    best: dict[str, float] = {}
    for r in table.iter_rows(named=True):
        if r["calibrated_on"] != r["set"] and np.isfinite(r["auroc"]):
            best[r["set"]] = max(best.get(r["set"], -1.0), float(r["auroc"]))
    lines = ["| method | " + " | ".join(sets) + " |", "|---|" + "---|" * len(sets)]
    for method in methods:
        cells = []
        for name in sets:
            row = lookup.get((method, name))
            text = _cell(row)
            if row is not None and row["calibrated_on"] != name and best.get(name) == row["auroc"]:
                text = f"**{text}**"
            cells.append(text)
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    n = {name: next((int(r["n"]) for r in table.iter_rows(named=True) if r["set"] == name), 0) for name in sets}
    lines.append("| held-out n | " + " | ".join(str(n[name]) for name in sets) + " |")
    return "\n".join(lines)


def shipped_detectors() -> dict[str, object]:
    """D1–D5 as the platform ships them (D2 / D4 trained on deepset's training split, seed settings)."""
    from rvu_pipelines.detectors.corpora import load_corpora
    from rvu_pipelines.detectors.ensemble import seed_ensemble
    from rvu_pipelines.detectors.evaluation import LodoSettings, train_transfer_models
    from rvu_pipelines.detectors.heuristic import HeuristicDetector
    from rvu_pipelines.detectors.pretrained import load_pretrained_detector

    corpus = load_corpora(("deepset",))["deepset"]
    d2, d4, _ = train_transfer_models(corpus, LodoSettings())
    assert d4 is not None  # with_d4 defaults to True
    return {
        "D1 regex heuristic": HeuristicDetector(),
        "D2 TF-IDF + LR (deepset train)": d2,
        "D3 NanoGuard (pretrained)": load_pretrained_detector("nanoguard").detector,
        "D4 fine-tuned MiniLM (deepset train)": d4,
        "D5 ensemble of D2 and D4 (deepset train)": seed_ensemble(d2, d4),
    }
