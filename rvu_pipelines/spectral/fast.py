"""The spectral statistics without a full eigendecomposition (kernel polynomial method on a signal sketch).

The exact path diagonalises the N × N Laplacian (O(N³)); every statistic but the Fiedler value is a
functional of two spectral measures, which Chebyshev moments give at the cost of a few N × N × r
matrix products:

* the signal's energy measure ``μ = Σ_k E_k δ(λ − λ_k)`` with moments ``tr(Yᵀ T_k(L̃) Y)``, where
  ``L̃ = 2L / b − I`` maps the spectrum into [−1, 1] (``b = 2`` for the normalised Laplacians, the
  Gershgorin bound ``2 max_i d_i`` for the combinatorial one) and ``Y = X Ω / √r`` is a Gaussian sketch of
  the d channels (``E[Y Yᵀ] = X Xᵀ``, so every moment is unbiased; with ``d ≤ r`` Y is X itself);
* the eigenvalue density, whose moments ``tr T_k(L̃)`` come from Rademacher probes (Hutchinson).

Both expansions are Jackson-damped (a non-negative kernel, so the smoothed measures stay measures). Then:
the cut-off eigenvalue is the point above which the smoothed density holds ``N − k_c`` eigenvalues (the
exact rule's band size); HFER is the smoothed signal measure above it (the closed-form Chebyshev
coefficients of a step); smoothness is ``1 + μ_1 / μ_0`` mapped back to the Laplacian's scale, which is
the Rayleigh quotient ``tr(Yᵀ L Y) / tr(Yᵀ Y)`` itself (no smoothing); spectral entropy assumes the energy
is spread evenly over the eigenvalues near each λ, ``H ≈ −∫ μ(λ) log(μ(λ) / (n(λ) ‖μ‖)) dλ / ‖μ‖`` with
``n`` the eigenvalue density, an upper bound on the exact entropy up to the smoothing; the Fiedler value
is the smallest eigenvalue once the known null vector is shifted to the top (Lanczos, ``eigsh``).
The random-walk Laplacian uses the degree-weighted signal ``D^{1/2} X`` on ``L_sym``, as the exact path.
The sketch and probes come from a fixed seed, so the result is deterministic.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse.linalg import ArpackNoConvergence, eigsh

from rvu_pipelines.spectral.errors import SpectralInputError
from rvu_pipelines.spectral.graph import (
    DEFAULT_CUTOFF_RATIO,
    LAPLACIANS,
    LaplacianKind,
    SpectralStats,
    laplacian,
)

DEFAULT_SKETCH = 32
DEFAULT_PROBES = 16
DEFAULT_MATVECS = 20
_GRID = 512


def jackson_damping(n_moments: int) -> np.ndarray:
    """Jackson kernel coefficients ``g_0 … g_{K−1}`` (the positive kernel that suppresses Gibbs ripples)."""
    k = np.arange(n_moments)
    q = np.pi / (n_moments + 1)
    return ((n_moments - k + 1) * np.cos(q * k) + np.sin(q * k) / np.tan(q)) / (n_moments + 1)


def chebyshev_moments(operator: np.ndarray, block: np.ndarray, matvecs: int) -> np.ndarray:
    """Per column c of ``block``, ``block[:, c]ᵀ T_k(operator) block[:, c]`` for k = 0 … 2·matvecs, from
    ``matvecs`` products (``T_{2k} = 2 T_k² − 1`` and ``T_{2k+1} = 2 T_{k+1} T_k − T_1``)."""
    previous, current = block, operator @ block
    moments = np.empty((2 * matvecs + 1, block.shape[1]))
    moments[0] = np.einsum("ij,ij->j", block, block)
    moments[1] = np.einsum("ij,ij->j", current, block)
    for k in range(1, matvecs + 1):
        moments[2 * k] = 2.0 * np.einsum("ij,ij->j", current, current) - moments[0]
        if k == matvecs:
            break
        following = 2.0 * (operator @ current) - previous
        moments[2 * k + 1] = 2.0 * np.einsum("ij,ij->j", following, current) - moments[1]
        previous, current = current, following
    return moments


def _fraction_above(damped: np.ndarray, thetas: np.ndarray) -> np.ndarray:
    """Share of a smoothed measure (damped moments, ``damped[0]`` its mass) at ``t ≥ cos θ``, per θ."""
    k = np.arange(1, damped.size)
    steps = 2.0 * np.sin(np.outer(thetas, k)) / (k * np.pi)
    return (thetas / np.pi * damped[0] + steps @ damped[1:]) / damped[0]


def _density(damped: np.ndarray, thetas: np.ndarray) -> np.ndarray:
    """A smoothed measure's density in θ (``t = cos θ``): ``(g_0 μ_0 + 2 Σ g_k μ_k cos kθ) / π``."""
    k = np.arange(1, damped.size)
    return np.maximum((damped[0] + 2.0 * np.cos(np.outer(thetas, k)) @ damped[1:]) / np.pi, 0.0)


def _fiedler(lap: np.ndarray, null: np.ndarray, shift: float) -> float:
    """λ_2: the smallest eigenvalue of ``L + shift · v vᵀ`` (v the unit null vector, moved out of the way)."""
    n = lap.shape[0]
    if n < 2:
        return 0.0
    if n <= 3:
        return float(max(np.linalg.eigvalsh(lap)[1], 0.0))
    shifted = lap + shift * np.outer(null, null)
    start = np.cos(np.arange(n) + 0.5)  # any fixed start vector not orthogonal to λ_2's eigenvector
    try:
        value = eigsh(shifted, k=1, which="SA", v0=start, tol=1e-6, return_eigenvectors=False)[0]
    except ArpackNoConvergence:
        value = np.linalg.eigvalsh(lap)[1]
    return float(max(value, 0.0))


def fast_fiedler(adjacency: np.ndarray, kind: LaplacianKind = "normalized") -> float:
    """λ_2 of the chosen Laplacian alone, in single precision (Lanczos; ``1e-5``-close to the exact value on
    graphs of attention weights): what an inline switch on the Fiedler value computes, with no signal and
    no eigendecomposition. The random-walk Laplacian has the normalised one's spectrum."""
    if kind not in LAPLACIANS:
        raise SpectralInputError(f"Unknown Laplacian '{kind}'. Allowed values: {list(LAPLACIANS)}")
    w = np.asarray(adjacency, dtype=np.float32)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] == 0:
        raise SpectralInputError(f"Adjacency must be square and non-empty; got shape {w.shape}.")
    if not np.all(np.isfinite(w)) or w.min() < 0 or not np.allclose(w, w.T, atol=1e-6):
        raise SpectralInputError("Adjacency must be finite, non-negative and symmetric.")
    return symmetric_fiedler(w, kind)


def symmetric_fiedler(w: np.ndarray, kind: LaplacianKind) -> float:
    """``fast_fiedler`` on a float32 adjacency its caller built symmetric, finite and non-negative (the
    checks cost as much as the solve at 512 tokens)."""
    n = w.shape[0]
    degrees = w.sum(axis=1, dtype=np.float64)
    if kind == "combinatorial":
        lap = -w
        lap[np.diag_indices(n)] += degrees.astype(np.float32)
        return _fiedler(lap, np.full(n, 1.0 / np.sqrt(n), dtype=np.float32), max(2.0 * float(degrees.max()), 1e-12))
    positive = degrees > 0
    inv_sqrt = np.zeros(n, dtype=np.float32)
    inv_sqrt[positive] = 1.0 / np.sqrt(degrees[positive])
    lap = -(inv_sqrt[:, None] * w * inv_sqrt[None, :])
    lap[np.diag_indices(n)] += positive.astype(np.float32)
    root = np.sqrt(np.maximum(degrees, 0.0))
    null = root / np.linalg.norm(root) if root.any() else np.full(n, 1.0 / np.sqrt(n))
    return _fiedler(lap, null.astype(np.float32), 2.0)


def fast_spectral_stats(
    adjacency: np.ndarray,
    signal: np.ndarray,
    *,
    kind: LaplacianKind = "normalized",
    cutoff_ratio: float = DEFAULT_CUTOFF_RATIO,
    sketch: int = DEFAULT_SKETCH,
    probes: int = DEFAULT_PROBES,
    matvecs: int = DEFAULT_MATVECS,
    seed: int = 0,
) -> SpectralStats:
    """``graph.spectral_stats`` (every eigenpair) estimated as the module docstring says: HFER, entropy and
    smoothness from ``2 · matvecs + 1`` Chebyshev moments of a ``sketch``-channel signal and ``probes``
    random probes; the Fiedler value by Lanczos."""
    if kind not in LAPLACIANS:
        raise SpectralInputError(f"Unknown Laplacian '{kind}'. Allowed values: {list(LAPLACIANS)}")
    if not 0.0 < cutoff_ratio < 1.0:
        raise SpectralInputError(f"cutoff_ratio must lie strictly between 0 and 1; got {cutoff_ratio}.")
    if min(sketch, probes, matvecs) < 1:
        raise SpectralInputError(f"sketch, probes and matvecs must be ≥ 1; got {sketch}, {probes}, {matvecs}.")
    w = np.asarray(adjacency, dtype=np.float64)
    x = np.asarray(signal, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or w.ndim != 2 or x.shape[0] != w.shape[0]:
        raise SpectralInputError(f"Signal must be N × d with N = {w.shape[0]} tokens; got shape {np.shape(signal)}.")
    if not np.all(np.isfinite(x)):
        raise SpectralInputError("Signal (hidden states) holds NaN or infinite values.")
    n = w.shape[0]
    degrees = w.sum(axis=1)
    if kind == "combinatorial":
        lap = laplacian(w, "combinatorial")
        bound = max(2.0 * float(degrees.max()), 1e-12)
        null = np.full(n, 1.0 / np.sqrt(n))
    else:
        lap = laplacian(w, "normalized")
        bound = 2.0
        root = np.sqrt(np.maximum(degrees, 0.0))
        null = root / np.linalg.norm(root) if root.any() else np.full(n, 1.0 / np.sqrt(n))
        if kind == "random_walk":
            x = root[:, None] * x
    fiedler = _fiedler(lap, null, bound)
    total = float(np.einsum("ij,ij->", x, x))
    if n < 2 or total <= 0.0:
        return SpectralStats(0.0, 0.0, 0.0, fiedler, 0.0, n)

    x = x / np.abs(x).max()  # every statistic is a ratio, blind to scale; single precision is not (underflow)
    rng = np.random.default_rng(seed)
    y = x if x.shape[1] <= sketch else x @ (rng.standard_normal((x.shape[1], sketch)) / np.sqrt(sketch))
    z = rng.choice(np.array([-1.0, 1.0]), size=(n, probes))
    operator = ((2.0 / bound) * lap - np.eye(n)).astype(np.float32)  # single precision: moments to ~1e-6
    moments = chebyshev_moments(operator, np.hstack([y, z]).astype(np.float32), matvecs).astype(np.float64)
    signal_moments = moments[:, : y.shape[1]].sum(axis=1)
    count_moments = moments[:, y.shape[1] :].mean(axis=1)
    count_moments[0] = n  # tr T_0 = N exactly
    if signal_moments[0] <= 0.0:
        return SpectralStats(0.0, 0.0, 0.0, fiedler, 0.0, n)
    smooth = bound / 2.0 * (1.0 + signal_moments[1] / signal_moments[0])

    damping = jackson_damping(moments.shape[0])
    signal_damped, count_damped = damping * signal_moments, damping * count_moments
    thetas = (np.arange(_GRID) + 0.5) * np.pi / _GRID
    boundary = int(np.clip(np.floor((1.0 - cutoff_ratio) * n), 1, n - 1))
    above = _fraction_above(count_damped, thetas) * n  # eigenvalues at t ≥ cos θ, increasing in θ
    theta_cut = float(np.interp(n - boundary, np.maximum.accumulate(above), thetas))
    hfer = float(_fraction_above(signal_damped, np.array([theta_cut]))[0])

    energy_density = _density(signal_damped, thetas) / signal_moments[0]
    count_density = np.maximum(_density(count_damped, thetas), 1e-12)
    valid = energy_density > 0
    per_eigenvalue = energy_density[valid] / count_density[valid]  # one eigenvalue's share near λ
    entropy_nats = float(-(energy_density[valid] * np.log(per_eigenvalue)).sum() * np.pi / _GRID)
    entropy_nats = min(max(entropy_nats, 0.0), float(np.log(n)))
    return SpectralStats(
        hfer=min(max(hfer, 0.0), 1.0),
        spectral_entropy=entropy_nats / float(np.log(n)),
        spectral_entropy_nats=entropy_nats,
        fiedler=fiedler,
        smoothness=float(max(smooth, 0.0)),
        n_tokens=n,
    )
