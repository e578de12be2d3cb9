"""The controls every spectral number stands beside: pairs evaluated as pairs, length, the padded partner.

Timeline: everything a decision uses is fitted on the calibration split (the switch's layer, statistic,
direction and threshold; each feature's direction; the length regression) and read on the held-out split.
Per held-out set the report gives, for the calibrated switch and for every (layer, statistic):

* **raw** AUROC of clean vs injected, its interval resampling pairs (``paired.paired_bootstrap_auroc``);
* **beyond length**: the AUROC of the score's residual after ``score ~ log(tokens)`` fitted on the clean
  calibration examples (``paired.auroc_beyond_length``), and **length alone** (the trivial baseline);
* **padded**: the AUROC of injected vs the *length-matched* clean partner (the clean document padded with
  benign text of the same source to the injected one's length, ``data.length_matched_clean``) — a score
  that only counts tokens sits at 0.5 here;
* the **paired test**: Wilcoxon signed-rank of injected − clean within each pair, and the pairwise AUROC.

A set without pairs (deepset: one prompt per group) gets the unpaired numbers and no paired test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from rvu_pipelines.spectral.errors import CalibrationError, SpectralInputError
from rvu_pipelines.spectral.graph import STAT_NAMES
from rvu_pipelines.spectral.killswitch import calibrate
from rvu_pipelines.spectral.paired import auroc_beyond_length, in_whole_pairs, paired_bootstrap_auroc, paired_test
from rvu_pipelines.spectral.study import FeatureSet

CONTROL_RESAMPLES = 500


def _roles(features: FeatureSet) -> np.ndarray:
    if features.roles is not None and features.roles.size == features.labels.size:
        return features.roles
    return np.where(features.labels == 1, "injected", "clean")


def _groups(features: FeatureSet) -> np.ndarray:
    if features.groups is not None and features.groups.size == features.labels.size:
        return features.groups
    return np.arange(features.labels.size).astype(str)


def score_controls(
    scores: np.ndarray, features: FeatureSet, *, resamples: int = CONTROL_RESAMPLES, seed: int = 0
) -> dict[str, Any]:
    """The controls of one score per example (oriented: higher = injected), fitted on calibration, read on
    held-out. Returns plain values (JSON-ready)."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    roles, groups, length = _roles(features), _groups(features), features.n_tokens.astype(np.float64)
    if s.size != roles.size:
        raise SpectralInputError(f"{s.size} scores for {roles.size} examples.")
    main = roles != "padded"
    cal = main & (features.splits == "calibration")
    held = main & (features.splits == "heldout")
    y = features.labels
    beyond = auroc_beyond_length(
        s[cal], length[cal], y[cal], s[held], length[held], y[held], groups[held], n_boot=resamples, seed=seed
    )
    out: dict[str, Any] = {"n_heldout": int(held.sum()), "n_calibration": int(cal.sum())} | beyond.as_dict()
    paired = in_whole_pairs(y[held], groups[held])
    if paired.sum() >= 4:
        test = paired_test(s[held][paired], y[held][paired], groups[held][paired], n_boot=resamples, seed=seed)
        out["paired_test"] = test.as_dict()
    padded_rows = (features.splits == "heldout") & ((roles == "padded") | (roles == "injected"))
    padded_groups = set(groups[(roles == "padded") & (features.splits == "heldout")].tolist())
    padded_rows &= np.isin(groups, list(padded_groups))
    if len(padded_groups) >= 2 and len(set(y[padded_rows].tolist())) == 2:  # a paired test needs two pairs
        out["padded"] = paired_bootstrap_auroc(
            s[padded_rows], y[padded_rows], groups[padded_rows], n_boot=resamples, seed=seed
        ).as_dict()
        out["padded_test"] = paired_test(
            s[padded_rows], y[padded_rows], groups[padded_rows], n_boot=resamples, seed=seed
        ).as_dict()
    return out


def detector_controls(
    detectors: Mapping[str, Any], spans: np.ndarray, features: FeatureSet, *, seed: int = 0
) -> list[dict[str, Any]]:
    """Every text detector (``name → object with .score(texts)``, e.g. ``comparison.shipped_detectors``)
    under the same controls as the switch, on the same examples: ``spans`` holds each example's
    statement / document text (``BaselineFeatures.spans``), one per row of ``features``."""
    texts = np.asarray(spans).reshape(-1)
    if texts.size != features.labels.size:
        raise SpectralInputError(f"{texts.size} texts for {features.labels.size} examples of '{features.name}'.")
    rows = []
    for name, detector in detectors.items():
        scores = np.asarray(detector.score(texts.tolist()), dtype=np.float64)
        if scores.shape != (texts.size,) or not np.isfinite(scores).all():
            raise SpectralInputError(f"Detector {name!r} returned {scores.shape} scores (finite expected).")
        rows.append({"detector": name} | score_controls(scores, features, seed=seed))
    return rows


def _main_part(features: FeatureSet, split: str) -> tuple[np.ndarray, np.ndarray]:
    mask = (_roles(features) != "padded") & (features.splits == split)
    return features.values[mask], features.labels[mask]


def switch_controls(features: FeatureSet, *, seed: int = 0, resamples: int = CONTROL_RESAMPLES) -> dict[str, Any]:
    """The switch calibrated on the whole calibration split (clean vs injected), with every control."""
    cal_x, cal_y = _main_part(features, "calibration")
    switch = calibrate(cal_x, cal_y, seed=seed)
    scores = switch.score(features.values)
    controls = score_controls(scores, features, resamples=resamples, seed=seed)
    held = (_roles(features) != "padded") & (features.splits == "heldout")
    fired = scores[held] >= switch.threshold
    labels = features.labels[held].astype(bool)
    padded = (_roles(features) == "padded") & (features.splits == "heldout")
    return {
        "switch": switch.as_dict(),
        "tpr": float(fired[labels].mean()) if labels.any() else None,
        "fpr": float(fired[~labels].mean()) if (~labels).any() else None,
        "fpr_padded": float((scores[padded] >= switch.threshold).mean()) if padded.any() else None,
    } | controls


def feature_table(
    features: FeatureSet, *, layers: Sequence[int] | None = None, resamples: int = 200, seed: int = 0
) -> pl.DataFrame:
    """Every (layer, statistic): direction from calibration (sign of the class-mean difference), calibration
    AUROC, held-out raw / beyond-length / length-only / padded AUROC."""
    from rvu_pipelines.spectral.uncertainty import auroc

    cal_x, cal_y = _main_part(features, "calibration")
    rows = []
    for layer in layers if layers is not None else range(features.values.shape[1]):
        for index, statistic in enumerate(STAT_NAMES):
            column = features.values[:, layer, index]
            calibration = cal_x[:, layer, index]
            direction = 1.0 if calibration[cal_y == 1].mean() >= calibration[cal_y == 0].mean() else -1.0
            try:
                controls = score_controls(direction * column, features, resamples=resamples, seed=seed)
            except CalibrationError:
                continue
            rows.append(
                {
                    "layer": int(layer),
                    "statistic": statistic,
                    "direction": direction,
                    "calibration_auroc": auroc(cal_y, direction * calibration),
                    "raw": controls["raw"]["value"],
                    "beyond_length": controls["beyond_length"]["value"],
                    "beyond_length_low": controls["beyond_length"]["low"],
                    "beyond_length_high": controls["beyond_length"]["high"],
                    "length_only": controls["length_only"]["value"],
                    "padded": controls.get("padded", {}).get("value"),
                    "n_heldout": controls["n_heldout"],
                }
            )
    return pl.DataFrame(rows)


def best_by_calibration(table: pl.DataFrame) -> dict[str, Any]:
    """The feature a defender would pick (highest calibration AUROC; ties: earlier layer), with its held-out
    numbers: the honest "best spectral statistic" (the held-out maximum over 120 features is optimistic)."""
    ranked = table.sort(["calibration_auroc", "layer"], descending=[True, False])
    return ranked.row(0, named=True)
