"""MEMSAD (seed 003, Def. 5 / Alg. 1): reject a memory write that is anomalously close to the victim queries.

Score (Eq. 7, the combined max-mean similarity). For a candidate c and the rolling query history
H = {q_1..q_m} (unit-norm embeddings, so cosine = inner product)

    s(c; H) = α · max_q cos(c, q) + (1 − α) · mean_q cos(c, q),   α = 1/2.

α = 1/2 is the seed's Eq. 7 as printed ("averages max-query and mean-query similarity"): the max term
catches a poison aimed at one query (AgentPoison, MINJA), the mean term one spread over many
(InjecMem's broad anchors); the seed's Corollary (combined scoring preserves the gradient coupling)
holds for any α in (0, 1). ``max_weight`` changes it; 1.0 is the seed's max-only Def. 5 score.

Calibration. µ̂ and σ̂ (ddof = 1) of s(m; H) over the benign reference entries m ∈ M_ref; a candidate is
rejected when s(c; H) > µ̂ + κσ̂ (κ = 2.0). A reference set too small for κ is refused (minimum N from the
seed's calibration bound, see ``minimum_calibration_size``); so are an empty history, NaN / wrong-dimension
/ non-unit vectors (``check_embeddings``).

Plain vs triggered calibration. H is whatever query history the defender has observed. *Plain*: H is the
benign query history (the victim questions as users ask them). *Triggered* (``fit_triggered``): the
attacker's clients send the victim questions with AgentPoison's trigger appended, those triggered queries
land in the agent's query log, and H includes them; both µ̂/σ̂ and the scores are then computed against the
history with the triggered queries in it. The benign reference entries are far from the odd triggered
queries, so the threshold drops (the seed: 0.473 → 0.436), while a poison optimised for the triggered
queries is now near-identical to part of H: the seed's TPR 0.00 → 1.00 on AgentPoison.

Rolling (online) calibration. ``observe`` appends arriving queries to a FIFO buffer and recalibrates
µ̂/σ̂ against the newest ``window`` of them. The seed's Theorem (online calibration regret) balances the
estimation error σ/√m against the drift bias mΔ/2 of an m-query window; minimising σ/√m + mΔ/2 gives
exactly m* = (σ/Δ)^{2/3}. We estimate both from the history stream itself (``estimate_window``):
y_t = mean over the reference entries of cos(m, q_t) is the per-query signal that moves µ̂; Δ is the
least-squares slope of y_t per query (set to 0 when |slope| < 3 standard errors: no detectable drift),
σ the standard deviation of the residuals around that line. With Δ = 0 the window is the whole buffer.

Cost: one (n × d) · (d × m) product per batch; no per-write Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.defense_catalog import write_defense
from rvu_pipelines.memory_poisoning.defenses.base import WriteContext
from rvu_pipelines.memory_poisoning.retrieval import check_embeddings

DEFAULT_KAPPA = 2.0
DEFAULT_MAX_WEIGHT = 0.5  # α in Eq. 7
DEFAULT_DELTA = 0.05
DEFAULT_TOLERANCE = 1.0  # threshold error allowed, in benign-score standard deviations
DEFAULT_MAX_HISTORY = 4096  # queries the rolling buffer keeps (the window is its newest m)
MIN_WINDOW = 10
DRIFT_T_STAT = 3.0  # a slope under three standard errors is treated as no drift
MAX_CALIBRATION_SIZE = 10_000_000

Window = int | Literal["auto"] | None


# --------------------------------------------------------------------------------------------------
# calibration shared by every write detector (MEMSAD, the baselines, the hybrid)
# --------------------------------------------------------------------------------------------------


def threshold_error_bound(n: int, kappa: float, *, delta: float = DEFAULT_DELTA) -> float:
    """η(N)/σ, the seed's calibration bound: w.p. ≥ 1 − δ, |τ_N − τ*| ≤ σ(N^-½ + κ(2(N−1))^-½)·sqrt(2 log(4/δ))."""
    if n < 2:
        return math.inf
    return (n**-0.5 + kappa * (2.0 * (n - 1)) ** -0.5) * math.sqrt(2.0 * math.log(4.0 / delta))


def minimum_calibration_size(
    kappa: float = DEFAULT_KAPPA, *, delta: float = DEFAULT_DELTA, tolerance: float = DEFAULT_TOLERANCE
) -> int:
    """The smallest reference set N whose threshold is within ``tolerance``·σ of µ + κσ w.p. ≥ 1 − δ.

    From ``threshold_error_bound`` (σ cancels). At δ = 0.05 and one σ: κ = 1.0 → 26, κ = 2.0 → 52,
    κ = 3.0 → 87. Below it the threshold could land anywhere from the bulk of the benign scores to far past
    them, so κ would not mean what it says. (The seed calibrates on N = 50.)
    """
    check_kappa(kappa)
    if not 0 < delta < 1:
        raise MemoryPoisoningInputError(f"delta must be in (0, 1), got {delta!r}")
    if not tolerance > 0:
        raise MemoryPoisoningInputError(f"tolerance must be positive, got {tolerance!r}")
    low, high = 2, 4
    while threshold_error_bound(high, kappa, delta=delta) > tolerance:
        high *= 2
        if high > MAX_CALIBRATION_SIZE:
            raise MemoryPoisoningInputError(
                f"no reference size up to {MAX_CALIBRATION_SIZE} reaches tolerance {tolerance}"
            )
    while low < high:  # the bound decreases in N
        mid = (low + high) // 2
        if threshold_error_bound(mid, kappa, delta=delta) <= tolerance:
            high = mid
        else:
            low = mid + 1
    return low


def check_kappa(kappa: float) -> float:
    if isinstance(kappa, bool) or not isinstance(kappa, int | float) or not math.isfinite(kappa) or kappa <= 0:
        raise MemoryPoisoningInputError(f"kappa must be a positive finite number, got {kappa!r}")
    return float(kappa)


@dataclass(frozen=True)
class Calibration:
    """µ̂, σ̂ of a detector's scores on ``n_reference`` benign reference entries, and its threshold µ̂ + κσ̂."""

    mu: float
    sigma: float
    kappa: float
    n_reference: int
    threshold: float
    mode: str = "plain"
    n_history: int = 0  # queries the scores were computed against (0 where the detector uses none)

    def standardized(self, scores: np.ndarray) -> np.ndarray:
        """(score − threshold) / σ̂: positive exactly where the detector flags, in benign-σ units."""
        return (np.asarray(scores, dtype=np.float64) - self.threshold) / self.sigma

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def calibrate(
    reference_scores: np.ndarray,
    kappa: float,
    *,
    detector: str,
    mode: str = "plain",
    n_history: int = 0,
    delta: float = DEFAULT_DELTA,
    tolerance: float = DEFAULT_TOLERANCE,
) -> Calibration:
    """µ̂ + κσ̂ from benign reference scores; refuses a set too small for κ, non-finite or constant scores."""
    kappa = check_kappa(kappa)
    scores = np.asarray(reference_scores, dtype=np.float64).reshape(-1)
    needed = minimum_calibration_size(kappa, delta=delta, tolerance=tolerance)
    if scores.size < needed:
        raise MemoryPoisoningInputError(
            f"{detector}: the calibration set has {scores.size} benign reference entries, too small for "
            f"kappa={kappa:g}: at least {needed} are needed for the threshold mu + kappa*sigma to be within "
            f"{tolerance:g} sigma of its population value with probability {1 - delta:.2f} (seed 003 calibration "
            "bound); add reference entries or lower kappa"
        )
    if not np.isfinite(scores).all():
        raise MemoryPoisoningInputError(f"{detector}: a reference score is NaN or infinite; check the inputs")
    mu, sigma = float(scores.mean()), float(scores.std(ddof=1))
    if not sigma > 0:
        raise MemoryPoisoningInputError(
            f"{detector}: all {scores.size} reference scores are equal ({mu:.4g}), so sigma is 0 and no threshold "
            "can be calibrated (are the reference entries duplicates?)"
        )
    return Calibration(mu, sigma, kappa, int(scores.size), mu + kappa * sigma, mode, n_history)


def reference_matrix(context: WriteContext, detector: str) -> np.ndarray:
    """The context's reference embeddings, checked (2-D, finite, unit rows) and non-empty."""
    vectors = np.asarray(context.reference_vectors)
    if vectors.ndim != 2 or vectors.shape[0] == 0:
        raise MemoryPoisoningInputError(
            f"{detector}: the benign reference set is empty (shape {vectors.shape}); "
            "calibration needs benign reference entries"
        )
    return check_embeddings(vectors, vectors.shape[0], vectors.shape[1], f"{detector} reference entries")


def history_matrix(vectors: np.ndarray | None, dimension: int, detector: str) -> np.ndarray:
    """A query history, checked against ``dimension``; an empty one is refused (Eq. 7 needs queries)."""
    array = np.zeros((0, dimension), dtype=np.float32) if vectors is None else np.asarray(vectors)
    if array.ndim != 2 or array.shape[0] == 0:
        raise MemoryPoisoningInputError(
            f"{detector}: the victim-query history H is empty (shape {array.shape}); MEMSAD scores a candidate "
            "against the queries the agent has served (Eq. 7): give at least one query embedding"
        )
    return check_embeddings(array, array.shape[0], dimension, f"{detector} query history")


def candidate_matrix(vectors: np.ndarray, dimension: int, detector: str) -> np.ndarray:
    array = np.asarray(vectors)
    if array.ndim == 1:
        array = array.reshape(1, -1)
    return check_embeddings(array, array.shape[0] if array.ndim == 2 else -1, dimension, f"{detector} candidates")


# --------------------------------------------------------------------------------------------------
# Eq. 7 and the rolling window
# --------------------------------------------------------------------------------------------------


def combined_scores(candidates: np.ndarray, history: np.ndarray, max_weight: float = DEFAULT_MAX_WEIGHT) -> np.ndarray:
    """Eq. 7 for each row of ``candidates`` against ``history`` (both unit-norm float32, unchecked)."""
    sims = candidates @ history.T
    return (max_weight * sims.max(axis=1) + (1.0 - max_weight) * sims.mean(axis=1)).astype(np.float64)


class CalibratedThreshold:
    """The ``calibration`` and ``threshold`` every write detector exposes once fitted (MEMSAD, the baselines,
    the hybrid check); reading either before ``fit`` is an error naming the detector."""

    name: str
    _calibration: Calibration | None

    @property
    def calibration(self) -> Calibration:
        if self._calibration is None:
            raise MemoryPoisoningInputError(f"{self.name}: call fit(context) before scoring or reading the threshold")
        return self._calibration

    @property
    def threshold(self) -> float:
        return self.calibration.threshold


@dataclass(frozen=True)
class WindowEstimate:
    """The rolling window m* = (σ/Δ)^{2/3} and what it was estimated from."""

    sigma: float  # per-query noise of y_t around its trend
    drift: float  # |slope| of y_t per query, 0 when not significant
    slope: float
    slope_se: float
    optimal: float  # (σ/Δ)^{2/3}, inf without drift
    window: int  # optimal, clipped to [min_window, n_history]
    n_history: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def optimal_window(sigma: float, drift: float) -> float:
    """m* = (σ/Δ)^{2/3}, the minimiser of σ/√m + mΔ/2 (seed 003, online calibration regret); inf if Δ = 0."""
    if sigma < 0 or drift < 0:
        raise MemoryPoisoningInputError(f"sigma and drift must be non-negative, got {sigma}, {drift}")
    if drift == 0:
        return math.inf
    return float((sigma / drift) ** (2.0 / 3.0))


def estimate_window(reference: np.ndarray, history: np.ndarray, *, min_window: int = MIN_WINDOW) -> WindowEstimate:
    """Estimate σ and the per-query drift Δ from the history stream (oldest first) and pick m*."""
    n = int(history.shape[0])
    if n < 3:
        return WindowEstimate(0.0, 0.0, 0.0, math.inf, math.inf, n, n)
    signal = (history @ reference.T).mean(axis=1).astype(np.float64)  # y_t
    t = np.arange(n, dtype=np.float64)
    t_centred = t - t.mean()
    slope = float((t_centred * (signal - signal.mean())).sum() / (t_centred**2).sum())
    residuals = signal - signal.mean() - slope * t_centred
    sigma = float(np.sqrt((residuals**2).sum() / (n - 2)))
    slope_se = sigma / float(np.sqrt((t_centred**2).sum()))
    drift = abs(slope) if slope_se == 0 or abs(slope) >= DRIFT_T_STAT * slope_se else 0.0
    optimal = optimal_window(sigma, drift)
    window = n if not math.isfinite(optimal) else int(min(n, max(min_window, math.ceil(optimal))))
    return WindowEstimate(sigma, drift, slope, slope_se, optimal, window, n)


# --------------------------------------------------------------------------------------------------
# the detector
# --------------------------------------------------------------------------------------------------


class MemsadDetector(CalibratedThreshold):
    """MEMSAD as a ``WriteDetector``: Eq. 7 against the rolling history, rejected above µ̂ + κσ̂.

    ``window``: None uses every query in the buffer, an int the newest that many, "auto" the m* of
    ``estimate_window`` (re-estimated at every ``observe``). ``max_history`` caps the FIFO buffer.
    """

    def __init__(
        self,
        kappa: float = DEFAULT_KAPPA,
        *,
        max_weight: float = DEFAULT_MAX_WEIGHT,
        window: Window = None,
        max_history: int = DEFAULT_MAX_HISTORY,
        min_window: int = MIN_WINDOW,
        delta: float = DEFAULT_DELTA,
        tolerance: float = DEFAULT_TOLERANCE,
        name: str = "memsad",
    ) -> None:
        self.kappa = check_kappa(kappa)
        if not 0.0 <= max_weight <= 1.0:
            raise MemoryPoisoningInputError(f"max_weight (alpha in Eq. 7) must be in [0, 1], got {max_weight}")
        if window is not None and window != "auto" and (isinstance(window, bool) or not isinstance(window, int)):
            raise MemoryPoisoningInputError(f"window must be None, 'auto' or a positive int, got {window!r}")
        if isinstance(window, int) and window < 1:
            raise MemoryPoisoningInputError(f"window must be at least 1 query, got {window}")
        if max_history < 1 or min_window < 1:
            raise MemoryPoisoningInputError("max_history and min_window must be at least 1")
        self.max_weight = float(max_weight)
        self.window: Window = window
        self.max_history = int(max_history)
        self.min_window = int(min_window)
        self.delta, self.tolerance = delta, tolerance
        self.name = name
        self._reference: np.ndarray | None = None
        self._buffer: np.ndarray | None = None
        self._history: np.ndarray | None = None
        self._calibration: Calibration | None = None
        self._window_estimate: WindowEstimate | None = None
        self._mode = "plain"
        self.reference_scores = np.zeros(0)

    # -- state ------------------------------------------------------------------------------------
    @property
    def history(self) -> np.ndarray:
        """The queries Eq. 7 is computed against now (the newest ``window_size`` of the buffer)."""
        self.calibration  # noqa: B018 - raises when not fitted
        assert self._history is not None
        return self._history

    @property
    def window_size(self) -> int:
        return int(self.history.shape[0])

    @property
    def window_estimate(self) -> WindowEstimate | None:
        """The last m* estimate (only with ``window="auto"``)."""
        return self._window_estimate

    @property
    def dimension(self) -> int:
        if self._reference is None:
            raise MemoryPoisoningInputError(f"{self.name}: call fit(context) first")
        return int(self._reference.shape[1])

    # -- calibration ------------------------------------------------------------------------------
    def fit(self, context: WriteContext) -> MemsadDetector:
        """Plain calibration: H = the context's query history (its newest ``window``)."""
        return self._fit(context, None, "plain")

    def fit_triggered(self, context: WriteContext, triggered_vectors: np.ndarray) -> MemsadDetector:
        """Triggered calibration: H = the context's history followed by the triggered queries observed."""
        return self._fit(context, triggered_vectors, "triggered")

    def _fit(self, context: WriteContext, triggered: np.ndarray | None, mode: str) -> MemsadDetector:
        reference = reference_matrix(context, self.name)
        dimension = reference.shape[1]
        history = history_matrix(context.history_vectors, dimension, self.name)
        if triggered is not None:
            triggered = history_matrix(triggered, dimension, f"{self.name} triggered")
            history = np.vstack([history, triggered])
        self._reference, self._mode = reference, mode
        self._buffer = history[-self.max_history :]
        self._refresh()
        return self

    def observe(self, query_vectors: np.ndarray, *, triggered: bool = False) -> Calibration:
        """Online calibration: append served queries (FIFO), re-pick the window, recompute µ̂/σ̂."""
        if self._buffer is None:
            raise MemoryPoisoningInputError(f"{self.name}: call fit(context) before observe()")
        queries = np.asarray(query_vectors)
        if queries.ndim == 1:
            queries = queries.reshape(1, -1)
        queries = check_embeddings(queries, queries.shape[0], self.dimension, f"{self.name} observed queries")
        if queries.shape[0]:
            self._buffer = np.vstack([self._buffer, queries])[-self.max_history :]
            if triggered:
                self._mode = "triggered"
            self._refresh()
        return self.calibration

    def _refresh(self) -> None:
        assert self._buffer is not None and self._reference is not None
        if self.window == "auto":
            self._window_estimate = estimate_window(self._reference, self._buffer, min_window=self.min_window)
            size = self._window_estimate.window
        else:
            size = self._buffer.shape[0] if self.window is None else min(int(self.window), self._buffer.shape[0])
        self._history = np.ascontiguousarray(self._buffer[-size:])
        self.reference_scores = combined_scores(self._reference, self._history, self.max_weight)
        self._calibration = calibrate(
            self.reference_scores,
            self.kappa,
            detector=self.name,
            mode=self._mode,
            n_history=int(size),
            delta=self.delta,
            tolerance=self.tolerance,
        )

    # -- scoring ----------------------------------------------------------------------------------
    def score(self, vectors: np.ndarray, texts: Sequence[str] = ()) -> np.ndarray:
        """Eq. 7 for each candidate (texts are not used: MEMSAD sees embeddings only)."""
        candidates = candidate_matrix(vectors, self.dimension, self.name)
        if candidates.shape[0] == 0:
            return np.zeros(0)
        return combined_scores(candidates, self.history, self.max_weight)

    def flags(self, vectors: np.ndarray, texts: Sequence[str] = ()) -> np.ndarray:
        return self.score(vectors, texts) > self.threshold

    def score_components(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(max, mean) cosine to H per candidate: the two terms of Eq. 7."""
        candidates = candidate_matrix(vectors, self.dimension, self.name)
        sims = candidates @ self.history.T
        return sims.max(axis=1).astype(np.float64), sims.mean(axis=1).astype(np.float64)


@write_defense("memsad", in_paper=True)
def memsad_defense(kappa: float, composite_kappa: float) -> MemsadDetector:
    return MemsadDetector(kappa)
