"""Attention Tracker (Hung et al. 2024, arXiv 2411.00348) as its public code computes it, as a baseline.

The "distraction effect": in some heads the last prompt token's attention to the user's instruction drops
when the data carries an injected instruction. The reference code (``detector/utils.py::process_attn``
with ``attn_func="normalize_sum"``, ``detector/attn.py`` with ``use_token="first"``) reads one query
position, the last prompt token (where the first answer token is generated), and per head (ℓ, h) keeps

    ``focus_{ℓ,h} = Attn(I) / (Attn(I) + Attn(D) + 1e-8)``,  ``Attn(X) = Σ_{i ∈ X} α_{ℓ,h}(last, i)``,

with ``I`` the tokens of the instruction (the system message's content) and ``D`` the tokens of the data
(the user message's content after its ``"Data: "`` prefix); chat-template tokens count as neither. NaN
becomes 0. The focus score of an example is the mean of ``focus_{ℓ,h}`` over the important heads; the
detector score is ``1 − focus``. ``raw`` mode (``Attn(I)`` alone) is kept for comparison.

Important heads (``select_head.py``): with the mean μ and population standard deviation σ of the per-head
map over normal (N) and attacked (A) calibration examples, a head is important when
``(μ_N − μ_A) − k (σ_N + σ_A) > 0``. The reference prints the heads for ``k ∈ {0, …, 5}`` and the authors
pick a set per model; here ``k`` is chosen from that grid as the one whose heads give the highest AUROC on
the calibration pairs themselves (at least one head; ties go to the larger k, i.e. fewer heads). No
evaluation example is ever used to choose heads or k.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from rvu_pipelines.spectral.errors import CalibrationError, SpectralInputError
from rvu_pipelines.spectral.model import ForwardTrace
from rvu_pipelines.spectral.uncertainty import auroc

FocusMode = Literal["normalised", "raw"]
FOCUS_MODES: tuple[str, ...] = ("normalised", "raw")
K_GRID: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)  # the reference's ``for i in range(6)``
DEFAULT_K = 1.0
EPSILON = 1e-8  # the reference's guard against an all-zero row


def _check_slice(part: slice, n: int, what: str) -> tuple[int, int]:
    start, stop, _ = part.indices(n)
    if stop <= start:
        raise SpectralInputError(f"The {what} slice {part} selects no token of {n}.")
    return start, stop


def instruction_attention(trace: ForwardTrace, instruction: slice) -> np.ndarray:
    """(layers, heads): the last token's attention mass on the instruction's tokens, per head."""
    start, stop = _check_slice(instruction, len(trace.tokens), "instruction")
    return np.stack([a[:, -1, start:stop].sum(axis=-1) for a in trace.attentions])


def last_token_attention(trace: ForwardTrace, instruction: slice, data: slice) -> tuple[np.ndarray, np.ndarray]:
    """(layers, heads) twice: the last token's attention mass on the instruction and on the data."""
    n = len(trace.tokens)
    i0, i1 = _check_slice(instruction, n, "instruction")
    d0, d1 = _check_slice(data, n, "data")
    if i0 < d1 and d0 < i1:
        raise SpectralInputError(f"The instruction {instruction} and data {data} slices overlap.")
    inst = np.stack([a[:, -1, i0:i1].sum(axis=-1) for a in trace.attentions])
    dat = np.stack([a[:, -1, d0:d1].sum(axis=-1) for a in trace.attentions])
    return inst, dat


def head_focus(instruction: np.ndarray, data: np.ndarray | None = None, mode: FocusMode = "normalised") -> np.ndarray:
    """The per-head map the detector averages: ``I / (I + D + ε)`` (``normalised``) or ``I`` (``raw``)."""
    inst = np.asarray(instruction, dtype=np.float64)
    if mode == "raw":
        return inst
    if mode != "normalised":
        raise SpectralInputError(f"Unknown focus mode {mode!r}; use one of {FOCUS_MODES}.")
    if data is None:
        raise SpectralInputError(
            "The normalised focus score needs the data attention; these features hold only the instruction "
            "attention (recompute the baselines, or use mode='raw')."
        )
    dat = np.asarray(data, dtype=np.float64)
    if dat.shape != inst.shape:
        raise SpectralInputError(f"Instruction attention {inst.shape} and data attention {dat.shape} differ in shape.")
    return np.nan_to_num(inst / (inst + dat + EPSILON), nan=0.0)


def select_heads(normal: np.ndarray, attacked: np.ndarray, k: float = DEFAULT_K) -> np.ndarray:
    """Boolean (layers, heads) mask of the important heads from (examples, layers, heads) maps."""
    n, a = np.asarray(normal, dtype=np.float64), np.asarray(attacked, dtype=np.float64)
    if n.ndim != 3 or a.ndim != 3 or n.shape[1:] != a.shape[1:] or min(len(n), len(a)) < 2:
        raise CalibrationError("Head selection needs ≥ 2 normal and ≥ 2 attacked examples of equal shape.")
    return (n.mean(0) - a.mean(0)) - k * (n.std(0) + a.std(0)) > 0


def focus_score(attention: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Mean per-head map over the important heads, per example (NaN when no head qualifies)."""
    values = np.asarray(attention, dtype=np.float64)
    if not heads.any():
        return np.full(values.shape[0], np.nan)
    return values[:, heads].mean(axis=1)


def sweep_k(
    normal: np.ndarray, attacked: np.ndarray, grid: tuple[float, ...] = K_GRID
) -> tuple[float, np.ndarray, float, dict[float, float]]:
    """Choose k on the calibration maps: the highest calibration AUROC of ``1 − focus`` with ≥ 1 head,
    ties to the larger k. Returns (k, heads, its AUROC, AUROC per k with ≥ 1 head)."""
    labels = np.r_[np.zeros(len(normal)), np.ones(len(attacked))]
    per_k: dict[float, float] = {}
    best: tuple[float, float, np.ndarray] | None = None
    for k in sorted(grid):
        heads = select_heads(normal, attacked, k=k)
        if not heads.any():
            continue
        scores = 1.0 - np.r_[focus_score(normal, heads), focus_score(attacked, heads)]
        per_k[k] = auroc(labels, scores)
        if best is None or per_k[k] >= best[1]:
            best = (k, per_k[k], heads)
    if best is None:
        raise CalibrationError(f"No head passes the μ − kσ rule for any k in {grid} on these calibration pairs.")
    return best[0], best[2], best[1], per_k
