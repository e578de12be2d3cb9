"""Attention Tracker (Hung et al. 2024, arXiv 2411.00348), reimplemented from the paper as a baseline.

The "distraction effect": in some heads the last token's attention to the user's instruction drops when
the data carries an injected instruction. Per head (ℓ, h) the instruction attention is
``Attn_{ℓ,h}(I) = Σ_{i ∈ I} α_{ℓ,h}(last token, i)``. Important heads are chosen from a few labelled
examples (the paper uses ≤ 30 synthetic pairs): with the mean μ and standard deviation σ of that
attention over the normal (N) and attacked (A) examples, a head is important when
``(μ_N − k σ_N) − (μ_A + k σ_A) > 0``. The focus score is the mean instruction attention over the
important heads; a low focus score means an injection, so the detector score is ``1 − focus``.
"""

from __future__ import annotations

import numpy as np

from rvu_pipelines.spectral.errors import CalibrationError, SpectralInputError
from rvu_pipelines.spectral.model import ForwardTrace

DEFAULT_K = 1.0


def instruction_attention(trace: ForwardTrace, instruction: slice) -> np.ndarray:
    """(layers, heads): the last token's attention mass on the instruction's tokens, per head."""
    n = len(trace.tokens)
    start, stop, _ = instruction.indices(n)
    if stop <= start:
        raise SpectralInputError(f"The instruction slice {instruction} selects no token of {n}.")
    return np.stack([a[:, -1, start:stop].sum(axis=-1) for a in trace.attentions])


def select_heads(normal: np.ndarray, attacked: np.ndarray, k: float = DEFAULT_K) -> np.ndarray:
    """Boolean (layers, heads) mask of the important heads from (examples, layers, heads) arrays."""
    n, a = np.asarray(normal, dtype=np.float64), np.asarray(attacked, dtype=np.float64)
    if n.ndim != 3 or a.ndim != 3 or n.shape[1:] != a.shape[1:] or min(len(n), len(a)) < 2:
        raise CalibrationError("Head selection needs ≥ 2 normal and ≥ 2 attacked examples of equal shape.")
    return (n.mean(0) - k * n.std(0)) - (a.mean(0) + k * a.std(0)) > 0


def focus_score(attention: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Mean instruction attention over the important heads, per example (NaN when no head qualifies)."""
    values = np.asarray(attention, dtype=np.float64)
    if not heads.any():
        return np.full(values.shape[0], np.nan)
    return values[:, heads].mean(axis=1)
