"""Statistics of the memory-poisoning study: AUROC CIs, exact rate intervals, Bonferroni comparisons."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.stats import (
    auroc,
    auroc_ci,
    binomial_test_tpr,
    clopper_pearson,
    compare_aurocs,
    operating_point,
    rate,
)


def _data(n_pos: int = 40, n_neg: int = 120, shift: float = 1.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.r_[np.ones(n_pos, dtype=int), np.zeros(n_neg, dtype=int)]
    scores = np.r_[rng.normal(shift, 1.0, n_pos), rng.normal(0.0, 1.0, n_neg)]
    return y, scores


def test_clopper_pearson_matches_known_values():
    assert clopper_pearson(0, 10) == (0.0, pytest.approx(0.3085, abs=1e-4))  # 1 - 0.025 ** (1 / 10)
    assert clopper_pearson(10, 10) == (pytest.approx(0.6915, abs=1e-4), 1.0)
    low, high = clopper_pearson(5, 10)
    assert (low, high) == (pytest.approx(0.1871, abs=1e-4), pytest.approx(0.8129, abs=1e-4))
    assert clopper_pearson(0, 1000)[1] == pytest.approx(0.00368, abs=1e-5)  # the seed's FPR CI [0, 0.004]
    result = rate(3, 20)
    assert result.rate == 0.15 and result.n == 20 and result.k == 3 and result.ci_low < 0.15 < result.ci_high
    with pytest.raises(MemoryPoisoningInputError, match="0 <= k <= n"):
        clopper_pearson(11, 10)


def test_auroc_matches_sklearn_and_handles_ties():
    y, scores = _data()
    assert auroc(y, scores) == pytest.approx(roc_auc_score(y, scores))
    assert auroc([1, 1, 0, 0], [2, 3, 0, 1]) == 1.0
    assert auroc([1, 1, 0, 0], [0, 1, 2, 3]) == 0.0
    assert auroc([1, 0], [0.5, 0.5]) == 0.5
    with pytest.raises(MemoryPoisoningInputError, match="both classes"):
        auroc([1, 1], [0.2, 0.3])
    with pytest.raises(MemoryPoisoningInputError, match="NaN"):
        auroc([1, 0], [np.nan, 0.3])


def test_bootstrap_ci_contains_the_point_auroc_states_n_and_is_reproducible():
    y, scores = _data()
    result = auroc_ci(y, scores, n_resamples=1000, seed=7)
    assert result.ci_low <= result.auroc <= result.ci_high
    assert (result.n_positive, result.n_negative, result.n_resamples, result.seed) == (40, 120, 1000, 7)
    assert auroc_ci(y, scores, n_resamples=1000, seed=7) == result
    big = auroc_ci(*_data(400, 1200), n_resamples=1000)
    assert big.ci_high - big.ci_low < result.ci_high - result.ci_low
    assert set(result.as_dict()) >= {"auroc", "ci_low", "ci_high", "n_positive", "n_negative", "n_resamples"}


def test_operating_point_counts_and_exact_intervals():
    y = np.r_[np.ones(10, dtype=int), np.zeros(20, dtype=int)]
    scores = np.r_[np.arange(10) + 1.0, np.zeros(20)]  # poisons 1..10, benign 0
    point = operating_point(y, scores, threshold=3.0)  # flags score > 3: poisons 4..10
    assert (point.tpr.k, point.tpr.n, point.fpr.k, point.fpr.n) == (7, 10, 0, 20)
    assert point.fpr.ci_high == pytest.approx(clopper_pearson(0, 20)[1])
    flat = point.as_dict()
    assert flat["tpr"] == 0.7 and flat["fpr_n"] == 20 and flat["tpr_n"] == 10 and flat["threshold"] == 3.0


def test_bonferroni_comparisons_separate_a_real_difference_from_none():
    y, strong = _data(shift=2.5)
    rng = np.random.default_rng(1)
    noise = rng.normal(size=y.size)
    for method in ("bootstrap", "permutation"):
        results = compare_aurocs(
            y, {"strong": strong, "noise": noise, "copy": strong.copy()}, method=method, n_resamples=1000
        )
        assert len(results) == 3 and all(r.m == 3 and r.alpha_corrected == pytest.approx(0.05 / 3) for r in results)
        by_pair = {(r.a, r.b): r for r in results}
        real = by_pair[("strong", "noise")]
        assert real.significant and real.p_value < 0.05 / 3 and real.difference > 0.3
        assert real.ci_low <= real.difference <= real.ci_high
        same = by_pair[("strong", "copy")]
        assert same.difference == 0.0 and not same.significant and same.p_value > 0.5
        assert real.p_adjusted == pytest.approx(min(1.0, 3 * real.p_value))
        assert (real.n_positive, real.n_negative) == (40, 120)
    # a scale change does not change AUROC: the permutation test uses ranks
    rescaled = compare_aurocs(y, {"a": strong, "b": 100 * strong + 3}, method="permutation", n_resamples=500)[0]
    assert rescaled.difference == 0.0 and not rescaled.significant
    with pytest.raises(MemoryPoisoningInputError, match="unknown detectors"):
        compare_aurocs(y, {"a": strong}, pairs=[("a", "b")])


def test_binomial_test_of_tpr():
    assert binomial_test_tpr(0, 10).reject is False
    assert binomial_test_tpr(5, 10, tpr0=0.1, alpha=0.003).reject  # P(X >= 5 | 0.1) ~ 0.0016
    assert not binomial_test_tpr(2, 10, tpr0=0.1, alpha=0.003).reject
