"""Calibration maths: the mixture's Bayes threshold, layer selection on calibration data, AUROC and its CI."""

from __future__ import annotations

import numpy as np
import pytest

from rvu_pipelines.spectral import STAT_NAMES, CalibrationError
from rvu_pipelines.spectral.killswitch import bayes_threshold, calibrate, evaluate, stratified_draw
from rvu_pipelines.spectral.uncertainty import auroc, auroc_estimate


def test_auroc_matches_scikit_learn_with_ties() -> None:
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 200)
    s = np.round(rng.normal(size=200) + y, 1)  # rounded: many ties
    assert auroc(y, s) == pytest.approx(roc_auc_score(y, s))
    with pytest.raises(CalibrationError):
        auroc(np.ones(5), np.arange(5))


def test_auroc_interval_covers_and_narrows_with_n() -> None:
    rng = np.random.default_rng(0)
    small_y, big_y = np.repeat([0, 1], 20), np.repeat([0, 1], 500)
    small = auroc_estimate(small_y, rng.normal(size=40) + small_y)
    big = auroc_estimate(big_y, rng.normal(size=1000) + big_y)
    assert small.low <= small.value <= small.high and big.low <= big.value <= big.high
    assert (big.high - big.low) < (small.high - small.low)
    assert big.low < 0.76 < big.high  # Φ(1/√2) = 0.760 for unit-variance classes one apart


def test_bayes_threshold_of_two_regimes() -> None:
    rng = np.random.default_rng(1)
    # equal weights and variances: the densities cross half-way between the means
    s = np.concatenate([rng.normal(0.05, 0.05, 4000), rng.normal(0.52, 0.05, 4000)])
    y = np.repeat([0, 1], 4000)
    assert bayes_threshold(s, y) == pytest.approx(0.285, abs=0.01)
    # unequal weights: the threshold moves towards the rarer regime's mean
    s = np.concatenate([rng.normal(0.0, 1.0, 900), rng.normal(4.0, 1.0, 100)])
    y = np.repeat([0, 1], [900, 100])
    expected = 2.0 + np.log(9.0) / 4.0  # w0 N(t;0,1) = w1 N(t;4,1)
    assert bayes_threshold(s, y) == pytest.approx(expected, abs=0.25)


def _features(n: int, informative_layer: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], n // 2)
    x = rng.uniform(0, 1, size=(n, 6, len(STAT_NAMES)))
    # HFER at the informative layer: low when firing (the seed's 0.05 vs 0.52 regimes)
    x[:, informative_layer, STAT_NAMES.index("hfer")] = np.where(y == 1, 0.05, 0.52) + rng.normal(0, 0.03, n)
    return x, y


def test_calibrate_finds_the_layer_direction_and_threshold_from_20_examples() -> None:
    x, y = _features(20, informative_layer=3)
    switch = calibrate(x, y)
    assert (switch.layer, switch.statistic, switch.direction) == (3, "hfer", -1.0)
    assert -0.4 < switch.threshold < -0.15  # between −0.52 and −0.05 in oriented units
    held_x, held_y = _features(400, informative_layer=3, seed=9)
    result = evaluate(switch, held_x, held_y, resamples=100)
    assert result.auroc.value > 0.99 and result.tpr.value > 0.95 and result.fpr.value < 0.05


def test_calibration_refuses_one_class_and_draws_are_stratified() -> None:
    x, y = _features(20, informative_layer=0)
    with pytest.raises(CalibrationError, match="each class"):
        calibrate(x[y == 1], y[y == 1])
    labels = np.repeat([0, 1], [150, 50])
    drawn = stratified_draw(labels, 20, seed=4)
    assert drawn.size == 20 and labels[drawn].sum() == 10
    assert np.array_equal(drawn, stratified_draw(labels, 20, seed=4))
    with pytest.raises(CalibrationError):
        stratified_draw(np.zeros(30), 20, seed=0)


def test_a_draw_stratified_by_source_spreads_each_class_over_the_sources() -> None:
    labels = np.array([1] * 16 + [0] * 16 + [1] * 4 + [0] * 4)
    sources = np.array(["bipia"] * 32 + ["injecagent"] * 8)
    drawn = stratified_draw(labels, 16, seed=3, strata=sources)
    for label in (0, 1):
        chosen = sources[drawn][labels[drawn] == label]
        assert sorted(chosen.tolist()) == ["bipia"] * 4 + ["injecagent"] * 4
    assert np.array_equal(drawn, stratified_draw(labels, 16, seed=3, strata=sources))
    plain = stratified_draw(labels, 16, seed=3)
    assert labels[plain].sum() == 8  # the label balance holds either way
    wide = stratified_draw(labels, 24, seed=3, strata=sources)  # injecagent runs out: bipia fills the rest
    assert (sources[wide] == "injecagent").sum() == 8 and labels[wide].sum() == 12
    with pytest.raises(CalibrationError, match="strata"):
        stratified_draw(labels, 16, seed=3, strata=sources[:5])
