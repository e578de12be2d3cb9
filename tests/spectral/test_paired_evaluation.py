"""Paired, length-controlled evaluation on synthetic pairs whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rvu_pipelines.spectral import CalibrationError, SpectralInputError
from rvu_pipelines.spectral.paired import (
    auroc_beyond_length,
    length_residualised,
    pair_differences,
    paired_bootstrap_auroc,
    paired_test,
)
from rvu_pipelines.spectral.uncertainty import auroc, auroc_estimate


def _pairs(n: int, seed: int, signal: float, length_effect: float) -> dict[str, np.ndarray]:
    """n (clean, injected) pairs: the injected one is longer; the score = length effect + signal + noise,
    with a per-pair offset shared by both members (the correlation pairing has to respect)."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(80, 400, n)
    lengths = np.c_[base, base + rng.uniform(30, 120, n)].reshape(-1)
    labels = np.tile([0, 1], n)
    offset = np.repeat(rng.normal(0, 1.0, n), 2)
    scores = length_effect * np.log(lengths) + signal * labels + offset + rng.normal(0, 0.1, 2 * n)
    return {"scores": scores, "labels": labels, "groups": np.repeat(np.arange(n), 2), "lengths": lengths}


def test_pure_length_score_has_no_signal_beyond_length() -> None:
    cal, ev = _pairs(150, 1, signal=0.0, length_effect=3.0), _pairs(150, 2, signal=0.0, length_effect=3.0)
    out = auroc_beyond_length(cal["scores"], cal["lengths"], cal["labels"], ev["scores"], ev["lengths"],
                              ev["labels"], ev["groups"], n_boot=200)  # fmt: skip
    assert out.raw.value > 0.6 and out.length_only.value > 0.6
    assert abs(out.beyond_length.value - 0.5) < 0.08
    assert out.beyond_length.low < 0.5 < out.beyond_length.high


def test_real_signal_survives_the_length_control() -> None:
    cal, ev = _pairs(150, 3, signal=2.0, length_effect=3.0), _pairs(150, 4, signal=2.0, length_effect=3.0)
    for fit_on in ("negatives", "all"):
        out = auroc_beyond_length(cal["scores"], cal["lengths"], cal["labels"], ev["scores"], ev["lengths"],
                                  ev["labels"], ev["groups"], fit_on=fit_on, n_boot=200)  # fmt: skip
        assert out.beyond_length.low > 0.6, fit_on
    residual = length_residualised(cal["scores"], cal["lengths"], ev["scores"], ev["lengths"], basis="both")
    assert residual.shape == ev["scores"].shape


def test_group_bootstrap_follows_the_correlation_structure() -> None:
    """Resampling groups is wider than resampling examples when a group's members share a label and an
    offset (near-duplicates count once, not four times), and narrower for (clean, injected) pairs that share
    an offset (the offset cancels within the pair, as in any paired design)."""
    rng = np.random.default_rng(5)
    labels = np.repeat(np.arange(60) % 2, 4)
    groups = np.repeat(np.arange(60), 4)
    scores = 0.5 * labels + np.repeat(rng.normal(0, 1, 60), 4) + rng.normal(0, 0.1, 240)
    clustered = paired_bootstrap_auroc(scores, labels, groups, n_boot=400)
    example = auroc_estimate(labels, scores, resamples=400)
    assert clustered.value == pytest.approx(example.value)
    assert (clustered.high - clustered.low) > 1.5 * (example.high - example.low)
    data = _pairs(120, 5, signal=0.5, length_effect=0.0)
    paired = paired_bootstrap_auroc(data["scores"], data["labels"], data["groups"], n_boot=400)
    example = auroc_estimate(data["labels"], data["scores"], resamples=400)
    assert (paired.high - paired.low) < (example.high - example.low)


def test_paired_test_finds_a_consistent_within_pair_shift() -> None:
    data = _pairs(60, 6, signal=0.3, length_effect=0.0)  # small next to the between-pair spread
    result = paired_test(data["scores"], data["labels"], data["groups"], n_boot=200)
    assert result.p_value < 1e-6 and result.pairwise_auroc.value > 0.9
    assert auroc(data["labels"], data["scores"]) < result.pairwise_auroc.value  # pairing removes the offset
    noise = _pairs(60, 7, signal=0.0, length_effect=0.0)
    assert paired_test(noise["scores"], noise["labels"], noise["groups"], n_boot=200).p_value > 0.01


def test_paired_inputs_are_checked() -> None:
    with pytest.raises(SpectralInputError, match="'b'"):
        pair_differences(np.zeros(4), np.array([0, 1, 0, 0]), np.array(["a", "a", "b", "b"]))
    with pytest.raises(SpectralInputError, match="differ in length"):
        paired_bootstrap_auroc(np.zeros(3), np.array([0, 1]), np.array([0, 0]))
    with pytest.raises(SpectralInputError, match="not finite"):
        paired_test(np.array([0.0, np.nan]), np.array([0, 1]), np.array([0, 0]))
    with pytest.raises(CalibrationError):
        paired_test(np.array([0.0, 1.0]), np.array([0, 1]), np.array([0, 0]))
    with pytest.raises(SpectralInputError, match="positive"):
        length_residualised(np.zeros(5), np.array([1, 2, 3, 0, 5]), np.zeros(1), np.ones(1))
    assert paired_test(np.zeros(6), np.tile([0, 1], 3), np.repeat([0, 1, 2], 2)).p_value == 1.0


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(-5, 5)), min_size=3, max_size=30), st.integers(0, 2**16))
def test_pairwise_auroc_and_bootstrap_properties(pairs: list[tuple[float, float]], seed: int) -> None:
    clean, injected = np.array(pairs).T
    scores = np.c_[clean, injected].reshape(-1)
    labels, groups = np.tile([0, 1], len(pairs)), np.repeat(np.arange(len(pairs)), 2)
    result = paired_test(scores, labels, groups, n_boot=50, seed=seed)
    wins = np.mean((injected > clean) + 0.5 * (injected == clean))
    assert result.pairwise_auroc.value == pytest.approx(wins)
    assert 0.0 <= result.p_value <= 1.0
    estimate = paired_bootstrap_auroc(scores, labels, groups, n_boot=50, seed=seed)
    assert 0.0 <= estimate.low <= estimate.high <= 1.0 and estimate.n == 2 * len(pairs)
    # the order of the pairs does not matter
    order = np.random.default_rng(seed).permutation(len(pairs))
    index = np.c_[2 * order, 2 * order + 1].reshape(-1)
    again = paired_test(scores[index], labels[index], groups[index], n_boot=50, seed=seed)
    assert again.wilcoxon_statistic == pytest.approx(result.wilcoxon_statistic)
