"""Statistics of the memory-poisoning study: AUROC CIs, exact rate intervals, Bonferroni comparisons."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.stats import (
    _weighted_auroc_rows,
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


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=2, max_size=12),
    st.lists(st.integers(0, 4), min_size=2, max_size=12),
    st.data(),
)
def test_weighted_auroc_equals_auroc_on_the_repeated_examples(pos, neg, data) -> None:
    """Weights are how often a cluster was drawn: the weighted AUROC must be the AUROC of the data with each
    example repeated that often (integer scores, so ties are exercised)."""
    w_pos = data.draw(st.lists(st.integers(1, 3), min_size=len(pos), max_size=len(pos)))
    w_neg = data.draw(st.lists(st.integers(1, 3), min_size=len(neg), max_size=len(neg)))
    weighted = _weighted_auroc_rows(
        np.asarray(pos, float), np.asarray(neg, float), np.asarray([w_pos], float), np.asarray([w_neg], float)
    )[0]
    repeated_pos, repeated_neg = np.repeat(pos, w_pos), np.repeat(neg, w_neg)
    labels = np.r_[np.ones(repeated_pos.size), np.zeros(repeated_neg.size)]
    assert weighted == pytest.approx(auroc(labels, np.r_[repeated_pos, repeated_neg]))


def test_the_clustered_bootstrap_counts_a_repeated_negative_once() -> None:
    """30 benign records each scored in 9 victim settings: the item bootstrap treats 270 negatives as
    independent and is too narrow; resampling records gives the width 30 distinct negatives allow."""
    rng = np.random.default_rng(3)
    pos = rng.normal(1.0, 1.0, 30)
    neg_records = rng.normal(0.0, 1.0, 30)
    repeats = 9
    neg = np.repeat(neg_records, repeats) + rng.normal(0.0, 0.05, 30 * repeats)  # near-identical copies
    y = np.r_[np.ones(30), np.zeros(neg.size)]
    scores = np.r_[pos, neg]
    clusters = np.r_[[f"p{i}" for i in range(30)], np.repeat([f"b{i}" for i in range(30)], repeats)]
    naive = auroc_ci(y, scores, n_resamples=2000)
    clustered = auroc_ci(y, scores, n_resamples=2000, clusters=clusters)
    distinct = auroc_ci(np.r_[np.ones(30), np.zeros(30)], np.r_[pos, neg_records], n_resamples=2000)
    width = {name: r.ci_high - r.ci_low for name, r in (("naive", naive), ("clustered", clustered), ("d", distinct))}
    assert clustered.auroc == naive.auroc
    assert (clustered.n_positive_clusters, clustered.n_negative_clusters) == (30, 30)
    assert (naive.n_positive_clusters, naive.n_negative_clusters) == (30, 270)
    assert width["clustered"] > 1.2 * width["naive"]
    assert width["clustered"] == pytest.approx(width["d"], rel=0.2)
    # singleton clusters are the ordinary stratified bootstrap (a different random stream, the same interval)
    singletons = auroc_ci(y, scores, n_resamples=4000, clusters=np.arange(y.size))
    assert singletons.ci_low == pytest.approx(naive.ci_low, abs=0.02)
    assert singletons.ci_high == pytest.approx(naive.ci_high, abs=0.02)
    with pytest.raises(MemoryPoisoningInputError, match="one cluster id per example"):
        auroc_ci(y, scores, clusters=clusters[:-1])


def test_clustered_comparisons_use_the_whole_family() -> None:
    rng = np.random.default_rng(5)
    y, strong = _data(n_pos=20, n_neg=20, shift=0.8, seed=5)
    weak = strong + rng.normal(0.0, 1.5, y.size)
    repeats = 6
    yy = np.r_[y[y == 1], np.repeat(y[y == 0], repeats)]
    expand = {name: np.r_[s[y == 1], np.repeat(s[y == 0], repeats)] for name, s in (("strong", strong), ("weak", weak))}
    clusters = np.r_[np.arange(20), np.repeat(np.arange(100, 120), repeats)]
    naive = compare_aurocs(yy, expand, n_resamples=2000)[0]
    clustered = compare_aurocs(yy, expand, n_resamples=2000, clusters=clusters, family_size=12)[0]
    assert clustered.difference == naive.difference
    assert clustered.ci_high - clustered.ci_low > 1.2 * (naive.ci_high - naive.ci_low)
    assert clustered.m == 12 and clustered.alpha_corrected == pytest.approx(0.05 / 12)
    assert clustered.p_adjusted == pytest.approx(min(1.0, 12 * clustered.p_value))
    permuted = compare_aurocs(yy, expand, n_resamples=500, clusters=clusters, method="permutation")[0]
    assert 0 < permuted.p_value <= 1
    with pytest.raises(MemoryPoisoningInputError, match="smaller than"):
        compare_aurocs(yy, expand, clusters=clusters, family_size=1, pairs=[("strong", "weak"), ("weak", "strong")])
