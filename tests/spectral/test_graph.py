"""The graph-spectral maths on graphs whose spectra are known in closed form (pure numpy, fast)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rvu_pipelines.spectral import (
    SpectralInputError,
    attention_adjacency,
    graph_fourier_basis,
    high_band,
    laplacian,
    spectral_energy,
    spectral_stats,
)
from rvu_pipelines.spectral.graph import TIE_TOLERANCE


def path_graph(n: int) -> np.ndarray:
    w = np.zeros((n, n))
    idx = np.arange(n - 1)
    w[idx, idx + 1] = w[idx + 1, idx] = 1.0
    return w


def complete_graph(n: int) -> np.ndarray:
    return np.ones((n, n)) - np.eye(n)


def two_cliques(m: int, bridge: bool = True) -> np.ndarray:
    w = np.zeros((2 * m, 2 * m))
    w[:m, :m] = complete_graph(m)
    w[m:, m:] = complete_graph(m)
    if bridge:
        w[m - 1, m] = w[m, m - 1] = 1.0
    return w


@pytest.mark.parametrize("n", [2, 5, 12])
def test_path_spectrum_closed_form(n: int) -> None:
    eigenvalues, eigenvectors = graph_fourier_basis(laplacian(path_graph(n)))
    k = np.arange(n)
    np.testing.assert_allclose(eigenvalues, 2 - 2 * np.cos(np.pi * k / n), atol=1e-10)
    # eigenvectors are the DCT-II cosines cos(pi k (j + 1/2) / n), up to sign
    j = np.arange(n)
    for mode in range(n):
        expected = np.cos(np.pi * mode * (j + 0.5) / n)
        expected /= np.linalg.norm(expected)
        assert abs(abs(expected @ eigenvectors[:, mode]) - 1.0) < 1e-8
    normalized, _ = graph_fourier_basis(laplacian(path_graph(n), "normalized"))
    np.testing.assert_allclose(normalized, 1 - np.cos(np.pi * k / (n - 1)), atol=1e-10)


@pytest.mark.parametrize("n", [3, 8])
def test_complete_graph_spectrum(n: int) -> None:
    eigenvalues, _ = graph_fourier_basis(laplacian(complete_graph(n)))
    np.testing.assert_allclose(eigenvalues, [0.0] + [float(n)] * (n - 1), atol=1e-10)
    normalized, _ = graph_fourier_basis(laplacian(complete_graph(n), "normalized"))
    np.testing.assert_allclose(normalized, [0.0] + [n / (n - 1)] * (n - 1), atol=1e-10)
    # a complete graph's Fiedler value is n; every zero-mean signal is all high frequency
    stats = spectral_stats(complete_graph(n), np.arange(n) - (n - 1) / 2)
    assert stats.fiedler == pytest.approx(n)
    assert stats.hfer == pytest.approx(1.0)


def test_two_cliques_fiedler() -> None:
    m = 6
    disconnected = spectral_stats(two_cliques(m, bridge=False), np.ones(2 * m))
    assert disconnected.fiedler == pytest.approx(0.0, abs=1e-10)
    barbell = spectral_stats(two_cliques(m), np.ones(2 * m))
    complete = spectral_stats(complete_graph(2 * m), np.ones(2 * m))
    # one bridging edge: lambda_2 <= |cut| * n / (|S| |S'|) = 2 / m, far below K_2m's 2m
    assert 0.0 < barbell.fiedler <= 2.0 / m
    assert barbell.fiedler < complete.fiedler / 20
    # the Fiedler vector separates the two cliques by sign
    _, vectors = graph_fourier_basis(laplacian(two_cliques(m)))
    signs = np.sign(vectors[:, 1])
    assert len(set(signs[:m])) == 1 and len(set(signs[m:])) == 1 and signs[0] != signs[-1]


def test_hfer_of_constant_and_top_eigenvector() -> None:
    w = path_graph(10)
    eigenvalues, vectors = graph_fourier_basis(laplacian(w))
    constant = spectral_stats(w, np.full((10, 3), 2.5))
    assert constant.hfer == pytest.approx(0.0, abs=1e-12)
    assert constant.smoothness == pytest.approx(0.0, abs=1e-12)
    assert constant.spectral_entropy == pytest.approx(0.0, abs=1e-12)
    top = spectral_stats(w, vectors[:, -1])
    assert top.hfer == pytest.approx(1.0)
    assert top.smoothness == pytest.approx(eigenvalues[-1])
    uniform = spectral_stats(w, vectors @ np.ones(10))  # equal energy in every mode
    assert uniform.spectral_entropy == pytest.approx(1.0)
    assert uniform.hfer == pytest.approx(1 / 10)  # cut-off 0.1 of 10 distinct modes: the top one


def test_cutoff_rule_keeps_eigenspaces_whole_and_skips_null_modes() -> None:
    lam = np.array([0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    assert high_band(lam, 0.1).tolist() == [False] * 7 + [True] * 3  # the 5.0 eigenspace whole
    assert high_band(lam, 0.5).tolist() == [False] * 3 + [True] * 7  # boundary index 5 -> all the 2.0s
    assert not high_band(np.zeros(6), 0.5).any()  # an edgeless graph has no high frequencies
    with pytest.raises(SpectralInputError):
        high_band(lam, 0.0)


def test_attention_symmetrisation() -> None:
    heads = np.array([[[1.0, 0.0], [0.5, 0.5]], [[1.0, 0.0], [0.1, 0.9]]])
    w = attention_adjacency(heads)
    np.testing.assert_allclose(w, [[1.0, 0.15], [0.15, 0.7]])
    with pytest.raises(SpectralInputError):
        attention_adjacency(-heads)
    with pytest.raises(SpectralInputError):
        attention_adjacency(np.zeros((2, 3)))
    with pytest.raises(SpectralInputError):
        laplacian(np.array([[0.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(SpectralInputError):
        spectral_stats(path_graph(4), np.ones((5, 2)))


def test_band_is_judged_relative_to_the_spectrum() -> None:
    """HFER does not change when every weight is scaled, so neither may the band: a graph with one faint edge
    (every other weight near zero) has that edge's mode as its high band, whichever order its tokens come in."""
    faint = np.full((4, 4), 3e-302)
    faint[0, 1] = faint[1, 0] = 1e-9
    signal = np.zeros((4, 1))
    signal[0, 0] = 1.0  # half its energy on the edge's mode (e0 - e1) / sqrt(2)
    perm = np.array([3, 1, 0, 2])
    for scale in (1e-12, 1.0, 1e6):
        w = faint * scale
        assert spectral_stats(w, signal, cutoff_ratio=0.5).hfer == pytest.approx(0.5)
        assert spectral_stats(w[np.ix_(perm, perm)], signal[perm], cutoff_ratio=0.5).hfer == pytest.approx(0.5)


def _random_graph_and_signal(data: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    weights, signal = data
    return (weights + weights.T) / 2, signal


graphs = st.integers(min_value=2, max_value=9).flatmap(
    lambda n: st.tuples(
        arrays(np.float64, (n, n), elements=st.floats(0.0, 1.0)),
        arrays(np.float64, (n, 3), elements=st.floats(-10.0, 10.0)),
    )
)


@settings(max_examples=60, deadline=None)
@given(graphs, st.sampled_from(["combinatorial", "normalized"]), st.floats(0.05, 0.95))
def test_statistics_are_bounded_and_permutation_invariant(data, kind, ratio) -> None:
    w, x = _random_graph_and_signal(data)
    # an eigenvalue on the cut-off's own tolerance edge (null mode or tie, relative to λ_max) falls on either
    # side with the solver's last bits, so the band there is not a property of the graph: such graphs are left out
    lam = np.linalg.eigvalsh(laplacian(w, kind))
    scale = max(float(lam[-1]), 1e-300)
    boundary = int(np.clip(np.floor((1.0 - ratio) * lam.size), 1, lam.size - 1))
    for edge in (TIE_TOLERANCE * scale, lam[boundary] - TIE_TOLERANCE * scale):
        assume(bool(np.all(np.abs(lam - edge) > 1e-12 * scale)))
    stats = spectral_stats(w, x, kind=kind, cutoff_ratio=ratio)
    assert 0.0 <= stats.hfer <= 1.0
    assert 0.0 <= stats.spectral_entropy <= 1.0
    assert stats.fiedler >= 0.0 and stats.smoothness >= -1e-9
    perm = np.random.default_rng(0).permutation(w.shape[0])
    permuted = spectral_stats(w[np.ix_(perm, perm)], x[perm], kind=kind, cutoff_ratio=ratio)
    assert permuted.hfer == pytest.approx(stats.hfer, abs=1e-6)
    assert permuted.fiedler == pytest.approx(stats.fiedler, abs=1e-8)
    assert permuted.smoothness == pytest.approx(stats.smoothness, abs=1e-6)
    # scaling the signal changes nothing (the statistics are energy shares)
    assert spectral_stats(w, 7.0 * x, kind=kind, cutoff_ratio=ratio).hfer == pytest.approx(stats.hfer, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(graphs)
def test_parseval_and_dirichlet_energy(data) -> None:
    w, x = _random_graph_and_signal(data)
    lap = laplacian(w)
    eigenvalues, vectors = graph_fourier_basis(lap)
    energy = spectral_energy(x, vectors)
    assert energy.sum() == pytest.approx(float((x**2).sum()), rel=1e-9, abs=1e-9)
    assert float((eigenvalues * energy).sum()) == pytest.approx(float(np.trace(x.T @ lap @ x)), rel=1e-7, abs=1e-7)
