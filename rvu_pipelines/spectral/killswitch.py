"""The kill switch: one (layer, statistic, direction, threshold), calibrated on a few labelled examples.

Calibration uses calibration examples only:

1. **Layer and statistic.** For every layer and statistic the direction is the sign of (mean of the
   firing class − mean of the other); the (layer, statistic) with the highest calibration AUROC in that
   direction wins (ties: the earlier layer, then the order of ``STAT_NAMES``).
2. **Threshold.** The oriented score ``s = direction · statistic`` is modelled as a two-regime mixture
   (seed 004): scikit-learn's ``GaussianMixture(2)``, initialised at the two class means (so the labels
   name the regimes) and fitted by EM on the calibration scores. The Bayes-optimal single threshold is
   where the weighted densities cross, ``π₁ N(t; μ₁, σ₁²) = π₀ N(t; μ₀, σ₀²)``, between the two means
   (a quadratic in t); with no crossing there, the midpoint of the means. The switch fires when
   ``s ≥ t``. Under a monotone likelihood ratio, one threshold is Bayes-optimal (seed 004's theorem).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from rvu_pipelines.spectral.errors import CalibrationError
from rvu_pipelines.spectral.graph import STAT_NAMES
from rvu_pipelines.spectral.uncertainty import Estimate, auroc, auroc_estimate, rate_estimate

MIN_PER_CLASS = 2
_VAR_FLOOR = 1e-12


@dataclass(frozen=True)
class KillSwitch:
    layer: int
    statistic: str
    direction: float
    threshold: float
    calibration_auroc: float
    n_calibration: int
    scale: float = 1.0  # pooled within-class std of the calibration scores (the probability's slope)

    def score(self, features: np.ndarray) -> np.ndarray:
        """Oriented scores from features shaped (examples, layers, statistics) in ``STAT_NAMES`` order."""
        return self.direction * np.asarray(features)[:, self.layer, STAT_NAMES.index(self.statistic)]

    def fires(self, features: np.ndarray) -> np.ndarray:
        return self.score(features) >= self.threshold

    def probability(self, features: np.ndarray) -> np.ndarray:
        """A monotone map of the score to (0, 1) that is exactly 0.5 at the threshold, so "fires" and
        "probability ≥ 0.5" agree: ``sigmoid((s − t) / scale)``."""
        z = (self.score(features) - self.threshold) / max(self.scale, 1e-12)
        return 1.0 / (1.0 + np.exp(-np.clip(z, -50.0, 50.0)))

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _check(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels).astype(int).reshape(-1)
    if x.ndim != 3 or x.shape[0] != y.size or x.shape[2] != len(STAT_NAMES):
        raise CalibrationError(
            f"Features must be (examples, layers, {len(STAT_NAMES)}) with one label per example; "
            f"got {x.shape} and {y.size} labels."
        )
    counts = [int((y == c).sum()) for c in (0, 1)]
    if min(counts) < MIN_PER_CLASS:
        raise CalibrationError(
            f"Calibration needs at least {MIN_PER_CLASS} examples of each class; got {counts[0]} negatives "
            f"and {counts[1]} positives."
        )
    return x, y


def orientation_and_auroc(values: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Direction (+1 / −1) that makes the firing class score higher, and the AUROC in that direction."""
    y = np.asarray(labels).astype(bool)
    direction = 1.0 if values[y].mean() >= values[~y].mean() else -1.0
    return direction, auroc(y, direction * values)


def select_layer(
    features: np.ndarray, labels: np.ndarray, layers: Sequence[int] | None = None
) -> tuple[int, str, float, float]:
    """(layer, statistic, direction, calibration AUROC) of the best single feature on these examples."""
    x, y = _check(features, labels)
    candidates = range(x.shape[1]) if layers is None else layers
    best: tuple[float, int, int, float] | None = None
    for layer in candidates:
        for s_index in range(len(STAT_NAMES)):
            values = x[:, layer, s_index]
            if not np.all(np.isfinite(values)) or np.ptp(values) == 0:
                continue
            direction, area = orientation_and_auroc(values, y)
            if best is None or area > best[0] + 1e-12:
                best = (area, layer, s_index, direction)
    if best is None:
        raise CalibrationError("No layer/statistic varies across the calibration examples.")
    area, layer, s_index, direction = best
    return layer, STAT_NAMES[s_index], direction, area


def _normal_crossing(w0: float, m0: float, v0: float, w1: float, m1: float, v1: float) -> float | None:
    """t in [m0, m1] with w0 N(t; m0, v0) = w1 N(t; m1, v1), or None."""
    a = 1.0 / (2 * v1) - 1.0 / (2 * v0)
    b = m0 / v0 - m1 / v1
    c = m1**2 / (2 * v1) - m0**2 / (2 * v0) + math.log((w0 * math.sqrt(v1)) / (w1 * math.sqrt(v0)))
    if abs(a) < 1e-15:
        roots = [] if abs(b) < 1e-15 else [-c / b]
    else:
        disc = b * b - 4 * a * c
        if disc < 0:
            return None
        root = math.sqrt(disc)
        roots = [(-b - root) / (2 * a), (-b + root) / (2 * a)]
    low, high = min(m0, m1), max(m0, m1)
    inside = [r for r in roots if low <= r <= high]
    if not inside:
        return None
    return min(inside, key=lambda r: abs(r - (m0 + m1) / 2))


def bayes_threshold(scores: np.ndarray, labels: np.ndarray, seed: int = 0) -> float:
    """The Bayes-optimal single threshold under a two-component Gaussian mixture fitted to ``scores``
    (higher = the firing regime), initialised at the class means."""
    from sklearn.mixture import GaussianMixture

    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).astype(bool).reshape(-1)
    if y.sum() < 1 or (~y).sum() < 1:
        raise CalibrationError("The mixture threshold needs both classes among the calibration examples.")
    means = np.array([[s[~y].mean()], [s[y].mean()]])
    spread = max(float(np.var(s)), _VAR_FLOOR)
    mixture = GaussianMixture(
        n_components=2,
        covariance_type="full",
        means_init=means,
        reg_covar=1e-6 * spread + _VAR_FLOOR,
        random_state=seed,
    ).fit(s[:, None])
    order = np.argsort(mixture.means_[:, 0])  # the regime with the lower mean is "do not fire"
    m0, m1 = (float(mixture.means_[i, 0]) for i in order)
    v0, v1 = (float(mixture.covariances_[i].reshape(-1)[0]) for i in order)
    w0, w1 = (float(mixture.weights_[i]) for i in order)
    if m1 - m0 < 1e-12:
        return float((means[0, 0] + means[1, 0]) / 2)
    crossing = _normal_crossing(w0, m0, v0, w1, m1, v1)
    return float(crossing) if crossing is not None else (m0 + m1) / 2


def calibrate(
    features: np.ndarray, labels: np.ndarray, *, layers: Sequence[int] | None = None, seed: int = 0
) -> KillSwitch:
    """Choose the layer and statistic, then the mixture threshold, from calibration examples only."""
    x, y = _check(features, labels)
    layer, statistic, direction, area = select_layer(x, y, layers)
    scores = direction * x[:, layer, STAT_NAMES.index(statistic)]
    threshold = bayes_threshold(scores, y, seed=seed)
    pooled = float(np.sqrt((np.var(scores[y == 0]) + np.var(scores[y == 1])) / 2.0))
    return KillSwitch(layer, statistic, direction, threshold, area, int(y.size), scale=pooled if pooled > 0 else 1.0)


@dataclass(frozen=True)
class Evaluation:
    auroc: Estimate
    tpr: Estimate
    fpr: Estimate
    accuracy: Estimate

    def as_dict(self) -> dict[str, dict[str, float | int]]:
        return {name: getattr(self, name).as_dict() for name in ("auroc", "tpr", "fpr", "accuracy")}


def evaluate(switch: KillSwitch, features: np.ndarray, labels: np.ndarray, **bootstrap_args: object) -> Evaluation:
    """Held-out AUROC of the switch's score and TPR / FPR / accuracy at its threshold, with bootstrap CIs."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    scores = switch.score(x)
    fired = scores >= switch.threshold
    return Evaluation(
        auroc=auroc_estimate(y, scores, **bootstrap_args),
        tpr=rate_estimate(fired[y], **bootstrap_args),
        fpr=rate_estimate(fired[~y], **bootstrap_args),
        accuracy=rate_estimate(fired == y, **bootstrap_args),
    )


def spread_over_strata(pool: np.ndarray, strata: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` indices of ``pool`` spread as evenly as availability allows over the strata present."""
    by_stratum = {value: rng.permutation(pool[strata[pool] == value]) for value in sorted(set(strata[pool].tolist()))}
    taken: dict[object, int] = dict.fromkeys(by_stratum, 0)
    while sum(taken.values()) < count:
        open_strata = [value for value in by_stratum if taken[value] < len(by_stratum[value])]
        for value in open_strata[: count - sum(taken.values())]:
            taken[value] += 1
    return np.concatenate([by_stratum[value][: taken[value]] for value in by_stratum] or [np.array([], dtype=int)])


def stratified_draw(labels: np.ndarray, size: int, seed: int, strata: np.ndarray | None = None) -> np.ndarray:
    """``size`` indices (half of each class where possible), without replacement, deterministic in ``seed``.

    ``strata`` (e.g. each example's source): within each class the draw is spread evenly over the strata,
    so a small calibration cannot learn the source in place of the label (8 of 10 positives from one set)."""
    y = np.asarray(labels).astype(bool)
    rng = np.random.default_rng(seed)
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    n_pos = min(len(pos), max(size // 2, size - len(neg)))
    n_neg = min(len(neg), size - n_pos)
    if n_pos < MIN_PER_CLASS or n_neg < MIN_PER_CLASS:
        raise CalibrationError(f"Cannot draw {size} examples with both classes from {len(pos)}+{len(neg)}.")
    if strata is None:
        return np.sort(np.concatenate([rng.choice(pos, n_pos, replace=False), rng.choice(neg, n_neg, replace=False)]))
    groups = np.asarray(strata)
    if groups.shape != y.shape:
        raise CalibrationError(f"strata has shape {groups.shape}; it needs one value per example {y.shape}.")
    chosen = [spread_over_strata(pos, groups, n_pos, rng), spread_over_strata(neg, groups, n_neg, rng)]
    return np.sort(np.concatenate(chosen))
