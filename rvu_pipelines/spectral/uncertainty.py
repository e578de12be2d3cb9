"""Finite-sample uncertainty: percentile bootstrap over examples (fixed seed), AUROC with its interval."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rvu_pipelines.spectral.errors import CalibrationError

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its percentile-bootstrap interval over ``n`` examples."""

    value: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}] (n={self.n})"

    def as_dict(self) -> dict[str, float | int]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}


def auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """P(score of a positive > score of a negative) + ½ P(tie): the Mann-Whitney form, O(n log n)."""
    y = np.asarray(labels).astype(bool).reshape(-1)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise CalibrationError("AUROC needs both classes among the examples.")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty_like(s)
    sorted_scores = s[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(average, counts)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def bootstrap(
    statistic: Callable[[np.ndarray], float],
    n: int,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> tuple[float, float]:
    """Percentile interval of ``statistic(indices)`` over resamples of ``range(n)``; resamples on which it
    raises ``CalibrationError`` (e.g. one class only) are skipped."""
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        try:
            values.append(statistic(rng.integers(0, n, size=n)))
        except CalibrationError:
            continue
    if not values:
        raise CalibrationError("Every bootstrap resample was degenerate (one class only?).")
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(np.asarray(values), [alpha, 1.0 - alpha])
    return float(low), float(high)


def auroc_estimate(labels: np.ndarray, scores: np.ndarray, **kwargs: object) -> Estimate:
    y = np.asarray(labels).reshape(-1)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    low, high = bootstrap(lambda idx: auroc(y[idx], s[idx]), y.size, **kwargs)  # type: ignore[arg-type]
    return Estimate(auroc(y, s), low, high, int(y.size))


def mean_estimate(values: np.ndarray, **kwargs: object) -> Estimate:
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        raise CalibrationError("No values to average.")
    low, high = bootstrap(lambda idx: float(v[idx].mean()), v.size, **kwargs)  # type: ignore[arg-type]
    return Estimate(float(v.mean()), low, high, int(v.size))


def rate_estimate(hits: np.ndarray, **kwargs: object) -> Estimate:
    """A proportion (TPR, FPR) with its bootstrap interval."""
    return mean_estimate(np.asarray(hits, dtype=np.float64), **kwargs)
