"""The eigendecomposition-free statistics against the exact ones (fast; no model)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rvu_pipelines.spectral import (
    SpectralInputError,
    attention_adjacency,
    config_statistic,
    config_stats,
    fast_fiedler,
    fast_spectral_stats,
    graph_config,
    prepare_signal,
    spectral_stats,
)
from rvu_pipelines.spectral.config import kept_positions

# stated tolerances (absolute) for the default sketch / probes / moments on real-shaped inputs
HFER_TOL, ENTROPY_TOL, SMOOTHNESS_REL_TOL, FIEDLER_TOL = 0.08, 0.1, 0.05, 1e-5


def real_shaped(seed: int, n: int = 160, heads: int = 9, d: int = 576) -> tuple[np.ndarray, np.ndarray]:
    """A causal softmax with a heavy token-0 column and low-rank hidden states with one massive token."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=2.0, size=(heads, n, n))
    logits[:, :, 0] += 3.0
    logits[:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] = -np.inf
    attention = np.exp(logits - logits.max(axis=-1, keepdims=True))
    attention /= attention.sum(axis=-1, keepdims=True)
    hidden = rng.normal(size=(n, 40)) @ rng.normal(size=(40, d)) + 0.3 * rng.normal(size=(n, d))
    hidden[0] *= 50.0
    return attention, hidden


@pytest.mark.parametrize("seed", [0, 1])
def test_fast_matches_exact_on_real_shaped_inputs(seed: int) -> None:
    attention, hidden = real_shaped(seed)
    config = graph_config("sink_free")
    keep = kept_positions(attention, config)
    w = attention_adjacency(attention)[np.ix_(keep, keep)]
    x = prepare_signal(hidden[keep], config.signal)
    exact = spectral_stats(w, x, kind="normalized")
    fast = fast_spectral_stats(w, x, kind="normalized")
    assert fast.hfer == pytest.approx(exact.hfer, abs=HFER_TOL)
    assert fast.spectral_entropy == pytest.approx(exact.spectral_entropy, abs=ENTROPY_TOL)
    assert fast.smoothness == pytest.approx(exact.smoothness, rel=SMOOTHNESS_REL_TOL)
    assert fast.fiedler == pytest.approx(exact.fiedler, abs=FIEDLER_TOL)
    assert fast.n_tokens == exact.n_tokens
    assert fast_spectral_stats(w, x, kind="normalized") == fast  # fixed seed: deterministic


def test_fast_rejects_bad_input() -> None:
    with pytest.raises(SpectralInputError):
        fast_spectral_stats(np.eye(3), np.ones((4, 2)))
    with pytest.raises(SpectralInputError):
        fast_spectral_stats(np.eye(3), np.ones((3, 2)), kind="laplace")  # type: ignore[arg-type]


graphs = st.integers(min_value=4, max_value=24).flatmap(
    lambda n: st.tuples(
        arrays(np.float64, (n, n), elements=st.floats(0.05, 1.0)),
        arrays(np.float64, (n, 3), elements=st.floats(-10.0, 10.0)),
    )
)


@settings(max_examples=30, deadline=None)
@given(graphs, st.sampled_from(["combinatorial", "normalized", "random_walk"]))
def test_fast_is_bounded_and_exact_where_it_can_be(data, kind) -> None:
    weights, x = data
    w = (weights + weights.T) / 2
    fast = fast_spectral_stats(w, x, kind=kind)
    exact = spectral_stats(w, x, kind=kind)
    assert 0.0 <= fast.hfer <= 1.0 and 0.0 <= fast.spectral_entropy <= 1.0
    # λ_2 by Lanczos and, with fewer channels than the sketch, the Rayleigh quotient, are exact
    assert fast.fiedler == pytest.approx(exact.fiedler, abs=1e-5)
    # single-precision moments are exact to ~1e-6 of the operator's spectral bound (2 * max degree for the
    # combinatorial Laplacian, 2 for the normalised ones), so a smoothness of 0 comes back as a few 1e-6 of it
    bound = 2.0 * float(w.sum(axis=1).max()) if kind == "combinatorial" else 2.0
    assert fast.smoothness == pytest.approx(exact.smoothness, rel=1e-4, abs=1e-6 * bound)


@pytest.mark.parametrize("name", ["sink_free", "sink_free_norm", "seed_study"])
def test_the_switch_statistic_alone_matches_the_exact_one(name: str) -> None:
    attention, hidden = real_shaped(3)
    config = graph_config(name)
    exact = config_stats(attention, hidden, config)
    fast = config_statistic(attention.astype(np.float32), hidden, config, "fiedler", method="fast")
    assert fast == pytest.approx(exact.fiedler, abs=FIEDLER_TOL)
    for statistic in ("hfer", "smoothness"):  # the exact method reads the full statistics
        assert config_statistic(attention, hidden, config, statistic) == getattr(exact, statistic)
    with pytest.raises(SpectralInputError, match="Allowed values"):
        config_statistic(attention, hidden, config, "energy")


def test_fast_refuses_a_configuration_that_keeps_few_eigenpairs() -> None:
    attention, hidden = real_shaped(4, n=60)
    with pytest.raises(SpectralInputError, match="eigenpairs"):
        config_stats(attention, hidden, graph_config("spectral_trust"), method="fast")


@settings(max_examples=30, deadline=None)
@given(graphs.map(lambda pair: pair[0]), st.sampled_from(["combinatorial", "normalized", "random_walk"]))
def test_fast_fiedler_is_the_exact_fiedler(weights, kind) -> None:
    w = (weights + weights.T) / 2
    exact = spectral_stats(w, np.ones((w.shape[0], 1)), kind=kind).fiedler
    assert fast_fiedler(w, kind) == pytest.approx(exact, abs=1e-5)


def test_fast_fiedler_rejects_what_is_not_a_graph() -> None:
    for bad in (np.ones((3, 4)), -np.eye(3), np.array([[0.0, 1.0], [0.0, 0.0]]), np.full((2, 2), np.nan)):
        with pytest.raises(SpectralInputError):
            fast_fiedler(bad)
    with pytest.raises(SpectralInputError, match="Allowed"):
        fast_fiedler(np.eye(3), "laplace")  # type: ignore[arg-type]


def test_a_tiny_signal_gives_the_same_statistics_as_its_scaled_copy() -> None:
    """Single precision would square 1e-91 to zero; the statistics are ratios, so scale must not matter."""
    weights = np.ones((4, 4))
    x = np.zeros((4, 3))
    x[0, 0] = 2.19588303e-91
    tiny = fast_spectral_stats(weights, x, kind="combinatorial")
    exact = spectral_stats(weights, x, kind="combinatorial")
    assert tiny.smoothness == pytest.approx(exact.smoothness, rel=1e-4) and tiny.smoothness > 0
    assert fast_spectral_stats(weights, x / x[0, 0], kind="combinatorial") == tiny
