"""Paired, length-controlled evaluation of a detector score on (clean, injected) pairs.

The contamination sets are built in pairs: one clean document and the same document with an attack
inserted. Examples of a pair are not independent (same context, and the injected one is always longer),
so intervals resample *groups*, the within-pair difference is tested directly (Wilcoxon signed-rank), and
length is controlled by regressing the score on length on calibration data and scoring the residual.

Length enters as ``log(length)`` by default: token / character counts are right-skewed, and attention
statistics dilute roughly as a softmax spread over more tokens, so the dependence is closer to linear in
the log; a linear term also extrapolates badly past the calibration range. ``basis="linear"`` or
``"both"`` are available.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from rvu_pipelines.spectral.errors import CalibrationError, SpectralInputError
from rvu_pipelines.spectral.uncertainty import BOOTSTRAP_RESAMPLES, Estimate, auroc, bootstrap, mean_estimate

LengthBasis = Literal["log", "linear", "both"]
FitOn = Literal["negatives", "all"]


def _arrays(scores: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1).astype(np.int64)
    g = np.asarray(groups).reshape(-1)
    if not s.size == y.size == g.size:
        raise SpectralInputError(f"scores ({s.size}), labels ({y.size}) and groups ({g.size}) differ in length.")
    if s.size == 0:
        raise SpectralInputError("No examples to evaluate.")
    if not np.isfinite(s).all():
        raise SpectralInputError(f"{int((~np.isfinite(s)).sum())} scores are not finite.")
    if not np.isin(y, (0, 1)).all():
        raise SpectralInputError("Labels must be 0 (clean) or 1 (injected).")
    return s, y, g


def _members(groups: np.ndarray) -> list[np.ndarray]:
    """Example indices per group, in order of first appearance."""
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    return [np.flatnonzero(inverse == code) for code in order]


def in_whole_pairs(labels: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Mask of the examples whose group holds exactly one clean and one injected example."""
    _, inverse = np.unique(groups, return_inverse=True)
    positives = np.bincount(inverse, weights=labels == 1)
    negatives = np.bincount(inverse, weights=labels == 0)
    return (positives[inverse] == 1) & (negatives[inverse] == 1)


def pair_differences(scores: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group (in order of first appearance): injected minus clean score, and the group ids. Every
    group must hold exactly one positive and one negative."""
    s, y, g = _arrays(scores, labels, groups)
    diffs, ids = [], []
    for members in _members(g):
        positives, negatives = members[y[members] == 1], members[y[members] == 0]
        if positives.size != 1 or negatives.size != 1:
            raise SpectralInputError(
                f"Group {g[members[0]]!r} has {positives.size} positive and {negatives.size} negative examples; "
                "a paired computation needs exactly one of each (filter out padded members or unpaired sets)."
            )
        diffs.append(s[positives[0]] - s[negatives[0]])
        ids.append(g[members[0]])
    return np.asarray(diffs, dtype=np.float64), np.asarray(ids)


def paired_bootstrap_auroc(
    scores: np.ndarray,
    labels: np.ndarray,
    groups: np.ndarray,
    n_boot: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> Estimate:
    """AUROC over all examples with a percentile interval from resampling whole groups (a cluster
    bootstrap: members of a pair stay together). ``n`` counts examples. Singleton groups make it the
    ordinary example bootstrap."""
    s, y, g = _arrays(scores, labels, groups)
    members = _members(g)

    def statistic(picked: np.ndarray) -> float:
        idx = np.concatenate([members[i] for i in picked])
        return auroc(y[idx], s[idx])

    low, high = bootstrap(statistic, len(members), resamples=n_boot, seed=seed, level=level)
    return Estimate(auroc(y, s), low, high, int(s.size))


@dataclass(frozen=True)
class PairedTest:
    """Within-pair comparison: Wilcoxon signed-rank test of injected − clean, and the pairwise AUROC
    (fraction of pairs with injected > clean, ties ½) with its interval over pairs."""

    n_pairs: int
    median_difference: float
    wilcoxon_statistic: float
    p_value: float
    alternative: str
    pairwise_auroc: Estimate

    def as_dict(self) -> dict[str, object]:
        return {
            "n_pairs": self.n_pairs,
            "median_difference": self.median_difference,
            "wilcoxon_statistic": self.wilcoxon_statistic,
            "p_value": self.p_value,
            "alternative": self.alternative,
            "pairwise_auroc": self.pairwise_auroc.as_dict(),
        }


def paired_test(
    scores: np.ndarray,
    labels: np.ndarray,
    groups: np.ndarray,
    *,
    alternative: Literal["two-sided", "greater", "less"] = "two-sided",
    n_boot: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> PairedTest:
    """Injected minus clean within each pair: ``scipy.stats.wilcoxon`` (zero differences dropped; p = 1
    when every difference is zero) and the pairwise AUROC with a bootstrap interval over pairs."""
    from scipy.stats import wilcoxon

    diffs, _ = pair_differences(scores, labels, groups)
    if diffs.size < 2:
        raise CalibrationError(f"A paired test needs ≥ 2 pairs, got {diffs.size}.")
    if np.all(diffs == 0):
        statistic, p_value = 0.0, 1.0
    else:
        result = wilcoxon(diffs, alternative=alternative, zero_method="wilcox")
        statistic, p_value = float(result.statistic), float(result.pvalue)
    wins = (diffs > 0).astype(np.float64) + 0.5 * (diffs == 0)
    return PairedTest(
        n_pairs=int(diffs.size),
        median_difference=float(np.median(diffs)),
        wilcoxon_statistic=statistic,
        p_value=p_value,
        alternative=alternative,
        pairwise_auroc=mean_estimate(wins, resamples=n_boot, seed=seed),
    )


def _design(length: np.ndarray, basis: LengthBasis) -> np.ndarray:
    n = np.asarray(length, dtype=np.float64).reshape(-1)
    if n.size == 0 or not np.isfinite(n).all() or (n <= 0).any():
        raise SpectralInputError("Lengths must be finite and positive (tokens or characters).")
    if basis == "log":
        return np.log(n)[:, None]
    if basis == "linear":
        return n[:, None]
    if basis == "both":
        return np.c_[n, np.log(n)]
    raise SpectralInputError(f"Unknown length basis {basis!r}; use 'log', 'linear' or 'both'.")


def length_residualised(
    scores_cal: np.ndarray,
    length_cal: np.ndarray,
    scores_eval: np.ndarray,
    length_eval: np.ndarray,
    *,
    basis: LengthBasis = "log",
) -> np.ndarray:
    """Eval residuals of ``score ~ 1 + f(length)`` fitted by OLS on the calibration examples passed."""
    from sklearn.linear_model import LinearRegression

    y_cal = np.asarray(scores_cal, dtype=np.float64).reshape(-1)
    y_eval = np.asarray(scores_eval, dtype=np.float64).reshape(-1)
    x_cal, x_eval = _design(length_cal, basis), _design(length_eval, basis)
    if y_cal.size != x_cal.shape[0] or y_eval.size != x_eval.shape[0]:
        raise SpectralInputError("Each score needs one length (calibration and evaluation).")
    if y_cal.size < x_cal.shape[1] + 2:
        raise CalibrationError(f"The length fit needs ≥ {x_cal.shape[1] + 2} calibration examples, got {y_cal.size}.")
    if not (np.isfinite(y_cal).all() and np.isfinite(y_eval).all()):
        raise SpectralInputError("Scores must be finite.")
    fit = LinearRegression().fit(x_cal, y_cal)
    return y_eval - fit.predict(x_eval)


@dataclass(frozen=True)
class BeyondLength:
    """Held-out AUROC of the raw score, of its length residual, and of length alone (the trivial baseline)."""

    raw: Estimate
    beyond_length: Estimate
    length_only: Estimate
    basis: str
    fit_on: str

    def as_dict(self) -> dict[str, object]:
        return {
            "raw": self.raw.as_dict(),
            "beyond_length": self.beyond_length.as_dict(),
            "length_only": self.length_only.as_dict(),
            "basis": self.basis,
            "fit_on": self.fit_on,
        }


def auroc_beyond_length(
    scores_cal: np.ndarray,
    length_cal: np.ndarray,
    labels_cal: np.ndarray,
    scores_eval: np.ndarray,
    length_eval: np.ndarray,
    labels_eval: np.ndarray,
    groups_eval: np.ndarray | None = None,
    *,
    basis: LengthBasis = "log",
    fit_on: FitOn = "negatives",
    n_boot: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> BeyondLength:
    """Raw, beyond-length and length-only AUROC on the evaluation examples, side by side.

    ``fit_on="negatives"`` (default) fits score ~ length on the clean calibration examples only: the
    residual is then the departure from what a clean text of that length scores, so a real signal that
    happens to correlate with length is not regressed away with it. ``"all"`` pools both classes (more
    conservative: it also removes signal collinear with length). Intervals resample ``groups_eval``
    (one group per example when None)."""
    y_cal = np.asarray(labels_cal).reshape(-1)
    if y_cal.size != np.asarray(scores_cal).reshape(-1).size:
        raise SpectralInputError("labels_cal and scores_cal differ in length.")
    if fit_on not in ("negatives", "all"):
        raise SpectralInputError(f"Unknown fit_on {fit_on!r}; use 'negatives' or 'all'.")
    keep = y_cal == 0 if fit_on == "negatives" else np.ones(y_cal.size, dtype=bool)
    residual = length_residualised(
        np.asarray(scores_cal, dtype=np.float64).reshape(-1)[keep],
        np.asarray(length_cal, dtype=np.float64).reshape(-1)[keep],
        scores_eval,
        length_eval,
        basis=basis,
    )
    y = np.asarray(labels_eval).reshape(-1)
    g = np.arange(y.size) if groups_eval is None else np.asarray(groups_eval).reshape(-1)

    def estimate(values: np.ndarray) -> Estimate:
        return paired_bootstrap_auroc(values, y, g, n_boot=n_boot, seed=seed)

    return BeyondLength(
        raw=estimate(np.asarray(scores_eval, dtype=np.float64)),
        beyond_length=estimate(residual),
        length_only=estimate(np.asarray(length_eval, dtype=np.float64)),
        basis=basis,
        fit_on=fit_on,
    )
