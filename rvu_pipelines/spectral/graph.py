"""Graph signal processing on one attention token graph (pure numpy; no model here).

The choices, written down once (seed 004, arXiv 2511.05804; the statistics as defined in the same author's
"Geometry of Reason", arXiv 2601.00791):

* **Adjacency.** A layer's attention ``A[h, i, j]`` (row i attends to column j; rows sum to 1, causal) is
  averaged over heads, ``Ā = mean_h A[h]``, and symmetrised ``W = (Ā + Āᵀ) / 2``. W is non-negative,
  symmetric, and keeps the self-attention diagonal (it cancels in the combinatorial Laplacian).
* **Laplacian.** Default the combinatorial ``L = D − W`` (``D = diag(W 1)``): symmetric positive
  semi-definite, the constant vector is its null vector, so the graph Fourier basis (the orthonormal
  eigenvectors ``U`` of ``L``, eigenvalues ascending) splits energy exactly (Parseval) and "smooth" means
  "close to constant across strongly attending tokens". ``laplacian="normalized"`` gives
  ``I − D^{-1/2} W D^{-1/2}`` (isolated nodes get a zero row) for comparison. ``laplacian="random_walk"``
  is ``I − D⁻¹W``: not symmetric, but similar to the normalised one (``I − D⁻¹W = D^{-1/2} L_sym D^{1/2}``),
  so its eigenvalues are ``L_sym``'s and its eigenvectors are ``ψ_k = D^{-1/2} v_k``. These are orthonormal
  in the degree inner product ``⟨x, y⟩_D = xᵀ D y`` (where ``I − D⁻¹W`` is self-adjoint), so the graph
  Fourier coefficients of X in that basis are ``C = Ψ⁻¹ X = Vᵀ D^{1/2} X``: ``spectral_stats`` projects the
  degree-weighted signal ``D^{1/2} X`` on ``L_sym``'s orthonormal eigenvectors, energies add up to
  ``tr(Xᵀ D X)`` (Parseval in the D-norm) and smoothness is the D-norm Rayleigh quotient
  ``tr(Xᵀ (D − W) X) / tr(Xᵀ D X)``.
* **Signal.** The hidden states the layer outputs, ``X = hidden_states[ℓ + 1]`` (tokens × d), each of the d
  channels one graph signal; spectral energy of mode k is ``E_k = Σ_c (Uᵀ X)[k, c]²``, ``Σ_k E_k = ‖X‖_F²``.
* **Cut-off.** With N tokens and high-frequency fraction ρ (default 0.1, as in the author's code), the
  boundary index is ``k_c = clip(floor((1 − ρ) N), 1, N − 1)``; the high band is every mode whose eigenvalue
  is at least ``λ_{k_c}`` (ties included, so the rule never splits an eigenspace and HFER does not depend on
  which orthonormal basis the solver picked inside it) and strictly positive (a null mode is never "high").
  Ties and null modes are judged relative to ``λ_max``, as HFER itself is unchanged when every weight is
  scaled: a graph whose weights are all tiny has the same high band as the same graph scaled up.
  ``HFER = Σ_{high} E_k / Σ_k E_k``; 0 for a zero signal.
* **Eigenpairs.** ``eigenpairs=K`` keeps only K modes, as sparse (Lanczos) solvers do: the ``K // 2``
  smallest and the rest from the top of the spectrum (all modes when N ≤ K). Energies, HFER (the cut-off
  rule applied to the K kept eigenvalues) and entropy (normalised by ``log K``) then use only those modes;
  smoothness stays the full Rayleigh quotient and the Fiedler value is still ``λ_2``.
* **Spectral entropy.** Shannon entropy of ``p_k = E_k / Σ E`` in nats, divided by ``log N`` so it lies in
  [0, 1] and sequences of different lengths compare (``spectral_entropy_nats`` keeps the raw value).
* **Fiedler value.** ``λ_2``, the second-smallest eigenvalue of the chosen Laplacian (0 iff disconnected).
* **Smoothness.** Dirichlet energy over total energy, ``tr(Xᵀ L X) / tr(Xᵀ X)`` (the Rayleigh quotient;
  ``Σ λ_k E_k / Σ E_k``); 0 for a constant signal, ``λ_max`` for the top eigenvector.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from rvu_pipelines.spectral.errors import SpectralInputError

LaplacianKind = Literal["combinatorial", "normalized", "random_walk"]
LAPLACIANS: tuple[str, ...] = ("combinatorial", "normalized", "random_walk")
DEFAULT_CUTOFF_RATIO = 0.1
TIE_TOLERANCE = 1e-9  # ties and null modes: eigenvalues within this fraction of λ_max


@dataclass(frozen=True)
class SpectralStats:
    """The four diagnostics of one (graph, signal) pair, plus what they were computed on."""

    hfer: float
    spectral_entropy: float
    spectral_entropy_nats: float
    fiedler: float
    smoothness: float
    n_tokens: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


STAT_NAMES: tuple[str, ...] = ("hfer", "spectral_entropy", "fiedler", "smoothness")


def attention_adjacency(attention: np.ndarray) -> np.ndarray:
    """``(mean_h A + (mean_h A)ᵀ) / 2`` from heads × N × N (or one N × N matrix)."""
    a = np.asarray(attention, dtype=np.float64)
    if a.ndim == 3:
        a = a.mean(axis=0)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise SpectralInputError(f"Attention must be heads × N × N or N × N with N ≥ 1; got shape {a.shape}.")
    if not np.all(np.isfinite(a)):
        raise SpectralInputError("Attention holds NaN or infinite values.")
    if a.min() < 0:
        raise SpectralInputError("Attention weights must be non-negative to be a graph's edge weights.")
    return (a + a.T) / 2.0


def laplacian(adjacency: np.ndarray, kind: LaplacianKind = "combinatorial") -> np.ndarray:
    """The combinatorial ``D − W``, the symmetric normalised ``I − D^{-1/2} W D^{-1/2}`` or the random-walk
    ``I − D⁻¹W`` Laplacian (isolated nodes get a zero row in both normalised ones)."""
    w = np.asarray(adjacency, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise SpectralInputError(f"Adjacency must be square; got shape {w.shape}.")
    if not np.allclose(w, w.T, atol=1e-10):
        raise SpectralInputError("Adjacency must be symmetric (symmetrise attention first: (A + Aᵀ) / 2).")
    degrees = w.sum(axis=1)
    if kind == "combinatorial":
        return np.diag(degrees) - w
    if kind == "normalized":
        inv_sqrt = np.zeros_like(degrees)
        positive = degrees > 0
        inv_sqrt[positive] = 1.0 / np.sqrt(degrees[positive])
        normalized = np.diag(positive.astype(np.float64)) - inv_sqrt[:, None] * w * inv_sqrt[None, :]
        return (normalized + normalized.T) / 2.0
    if kind == "random_walk":
        inv = np.zeros_like(degrees)
        positive = degrees > 0
        inv[positive] = 1.0 / degrees[positive]
        return np.diag(positive.astype(np.float64)) - inv[:, None] * w
    raise SpectralInputError(f"Unknown Laplacian '{kind}'. Allowed values: {list(LAPLACIANS)}")


def graph_fourier_basis(lap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending, clipped at 0) and orthonormal eigenvectors (columns) of a symmetric Laplacian."""
    eigenvalues, eigenvectors = np.linalg.eigh(np.asarray(lap, dtype=np.float64))
    return np.maximum(eigenvalues, 0.0), eigenvectors


def high_band(eigenvalues: np.ndarray, cutoff_ratio: float = DEFAULT_CUTOFF_RATIO) -> np.ndarray:
    """Boolean mask of the high-frequency modes under the cut-off rule in the module docstring."""
    if not 0.0 < cutoff_ratio < 1.0:
        raise SpectralInputError(f"cutoff_ratio must lie strictly between 0 and 1; got {cutoff_ratio}.")
    lam = np.asarray(eigenvalues, dtype=np.float64)
    n = lam.size
    if n < 2:
        return np.zeros(n, dtype=bool)
    boundary = int(np.clip(np.floor((1.0 - cutoff_ratio) * n), 1, n - 1))
    scale = float(lam[-1])  # relative: solver error is about machine epsilon times λ_max
    return (lam >= lam[boundary] - TIE_TOLERANCE * scale) & (lam > TIE_TOLERANCE * scale)


def spectral_energy(signal: np.ndarray, eigenvectors: np.ndarray) -> np.ndarray:
    """Energy per graph frequency, ``E_k = Σ_c (Uᵀ X)[k, c]²``; a 1-D signal is one channel."""
    x = np.asarray(signal, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] != eigenvectors.shape[0]:
        raise SpectralInputError(
            f"Signal must be N × d with N = {eigenvectors.shape[0]} tokens; got shape {np.shape(signal)}."
        )
    if not np.all(np.isfinite(x)):
        raise SpectralInputError("Signal (hidden states) holds NaN or infinite values.")
    coefficients = eigenvectors.T @ x
    return np.einsum("kc,kc->k", coefficients, coefficients)


def kept_modes(n: int, eigenpairs: int | None) -> np.ndarray:
    """Indices (ascending) of the modes a K-eigenpair solver returns: ``K // 2`` from the bottom, the rest from
    the top (the same split as a smallest-plus-largest Lanczos pair of calls); all modes when ``N ≤ K``."""
    if eigenpairs is None or n <= eigenpairs:
        return np.arange(n)
    if eigenpairs < 2:
        raise SpectralInputError(f"eigenpairs must be at least 2 (λ_2 is one of them); got {eigenpairs}.")
    k_small = min(eigenpairs // 2, n - 2)
    k_large = min(eigenpairs - k_small, n - k_small - 1)
    return np.concatenate([np.arange(k_small), np.arange(n - k_large, n)])


def spectral_stats(
    adjacency: np.ndarray,
    signal: np.ndarray,
    *,
    kind: LaplacianKind = "combinatorial",
    cutoff_ratio: float = DEFAULT_CUTOFF_RATIO,
    eigenpairs: int | None = None,
) -> SpectralStats:
    """HFER, spectral entropy, Fiedler value and smoothness of ``signal`` on the graph ``adjacency``
    (``eigenpairs``: use only that many modes, see the module docstring)."""
    if kind == "random_walk":
        # same spectrum as L_sym; the D-orthonormal eigenbasis D^{-1/2} V turns X into coefficients Vᵀ D^{1/2} X
        degrees = np.asarray(adjacency, dtype=np.float64).sum(axis=1)
        x = np.asarray(signal, dtype=np.float64)
        weighted = np.sqrt(np.maximum(degrees, 0.0)).reshape((-1,) + (1,) * (x.ndim - 1)) * x
        return spectral_stats(adjacency, weighted, kind="normalized", cutoff_ratio=cutoff_ratio, eigenpairs=eigenpairs)
    lap = laplacian(adjacency, kind)
    eigenvalues, eigenvectors = graph_fourier_basis(lap)
    energy = spectral_energy(signal, eigenvectors)
    n = eigenvalues.size
    smooth_all = float((eigenvalues * energy).sum() / energy.sum()) if energy.sum() > 0 else 0.0
    fiedler = float(eigenvalues[1]) if n > 1 else 0.0
    if eigenpairs is not None and eigenpairs < n:
        modes = kept_modes(n, eigenpairs)
        eigenvalues, energy = eigenvalues[modes], energy[modes]
    n_modes = eigenvalues.size
    total = float(energy.sum())
    mask = high_band(eigenvalues, cutoff_ratio)
    if total <= 0.0:
        hfer = entropy_nats = smooth = 0.0
    else:
        hfer = float(energy[mask].sum() / total)
        p = energy / total
        nonzero = p[p > 0]
        entropy_nats = float(-(nonzero * np.log(nonzero)).sum())
        smooth = float((eigenvalues * energy).sum() / total) if n_modes == n else smooth_all
    entropy = entropy_nats / float(np.log(n_modes)) if n_modes > 1 else 0.0
    return SpectralStats(
        hfer=min(max(hfer, 0.0), 1.0),
        spectral_entropy=min(max(entropy, 0.0), 1.0),
        spectral_entropy_nats=entropy_nats,
        fiedler=fiedler,
        smoothness=smooth,
        n_tokens=n,
    )
