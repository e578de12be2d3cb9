"""The statistics the seed reports, with n stated in every result (seed 003, §6 and Appendix).

- ``auroc_ci``: AUROC (Mann-Whitney, ties counted half) with a percentile bootstrap 95% CI. Resamples
  are stratified (poisons and benign writes resampled separately, each to its own n), so every resample
  holds both classes; 2,000 resamples, seed 20260505 unless told. With ``clusters`` (one id per example,
  e.g. the memory record it is) the bootstrap resamples whole clusters within each class: when the same
  benign record is a negative in several victim settings, its copies are one draw, not several independent
  ones, so the interval is as wide as the number of distinct records allows.
- ``rate``, ``operating_point``: TPR and FPR at a threshold with Clopper-Pearson exact intervals
  (beta quantiles, scipy), e.g. 0 of 10 → [0, 0.3085].
- ``compare_aurocs``: pairwise AUROC differences on the *same* examples, Bonferroni-corrected: each of
  the m pairs is tested at α/m. The test is a paired stratified bootstrap of ΔAUROC (the CI is the
  percentile interval of the resampled differences; the two-sided p-value is the share of centred
  resampled differences at least as large as the observed one), or ``method="permutation"``: a paired
  permutation test that swaps, per example, the two detectors' normalised ranks (their AUROC is
  rank-based, so ranks make scores on different scales exchangeable under H0: equal AUROC). Both take
  ``clusters`` (resampled / swapped per cluster) and ``family_size``: the m of the Bonferroni family when
  the pairs of one call are part of a larger one (a table of comparisons made over several cells).
- ``binomial_test_tpr``: the seed's "H0: TPR = tpr0" one-sided exact binomial test.

Every result is a frozen dataclass with ``as_dict()`` for MLflow / asset metadata.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from rvu_pipelines.errors import MemoryPoisoningInputError

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 20260505
DEFAULT_LEVEL = 0.95
DEFAULT_ALPHA = 0.05


def _labels_scores(
    y_true: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y_true).reshape(-1)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape or y.size == 0:
        raise MemoryPoisoningInputError(f"need one score per label: {y.size} labels, {s.size} scores")
    if not np.isin(y, (0, 1)).all():
        raise MemoryPoisoningInputError("labels must be 0 (benign) or 1 (poison)")
    if not (y == 1).any() or not (y == 0).any():
        raise MemoryPoisoningInputError(f"AUROC needs both classes: {(y == 1).sum()} poisons, {(y == 0).sum()} benign")
    if not np.isfinite(s).all():
        raise MemoryPoisoningInputError("a score is NaN or infinite")
    return y.astype(np.int64), s


def auroc(y_true: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray) -> float:
    """P(score of a poison > score of a benign write) + ½ P(tie)."""
    y, s = _labels_scores(y_true, scores)
    return float(_auroc_rows(s[y == 1][None, :], s[y == 0][None, :])[0])


def _auroc_rows(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """Row-wise Mann-Whitney AUROC of positive vs negative score matrices (rows = resamples)."""
    from scipy.stats import rankdata

    both = np.concatenate([pos, neg], axis=1)
    ranks = rankdata(both, axis=1)  # mid-ranks: ties count half
    n_pos, n_neg = pos.shape[1], neg.shape[1]
    return (ranks[:, :n_pos].sum(axis=1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def _check_resampling(n_resamples: int, level: float) -> None:
    if n_resamples < 100:
        raise MemoryPoisoningInputError(f"use at least 100 resamples, got {n_resamples}")
    if not 0 < level < 1:
        raise MemoryPoisoningInputError(f"confidence level must be in (0, 1), got {level}")


@dataclass(frozen=True)
class AurocResult:
    auroc: float
    ci_low: float
    ci_high: float
    n_positive: int
    n_negative: int
    n_resamples: int
    seed: int
    level: float
    n_positive_clusters: int  # distinct clusters resampled (= n_positive without clusters)
    n_negative_clusters: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cluster_codes(clusters: Sequence[Any] | np.ndarray | None, n: int) -> np.ndarray | None:
    if clusters is None:
        return None
    c = np.asarray(clusters).reshape(-1)
    if c.size != n:
        raise MemoryPoisoningInputError(f"need one cluster id per example: {n} examples, {c.size} cluster ids")
    return np.unique(c, return_inverse=True)[1].reshape(-1)


def _cluster_weights(codes: np.ndarray, rng: np.random.Generator, n_resamples: int) -> np.ndarray:
    """(resamples x examples) weights: how often each example's cluster is drawn when the k clusters of
    one class are resampled with replacement (k draws)."""
    _, inverse = np.unique(codes, return_inverse=True)
    k = int(inverse.max()) + 1
    counts = rng.multinomial(k, np.full(k, 1.0 / k), size=n_resamples)
    return counts[:, inverse].astype(np.float64)


def _weighted_auroc_rows(pos: np.ndarray, neg: np.ndarray, w_pos: np.ndarray, w_neg: np.ndarray) -> np.ndarray:
    """Row-wise Mann-Whitney AUROC with example weights (rows = resamples; ties count half). The scores are
    fixed, only the weights change, so the score levels are sorted once."""
    from scipy import sparse

    levels, inverse = np.unique(np.r_[pos, neg], return_inverse=True)
    inverse = inverse.reshape(-1)

    def per_level(weights: np.ndarray, codes: np.ndarray) -> np.ndarray:
        onehot = sparse.csr_matrix(
            (np.ones(codes.size), (np.arange(codes.size), codes)), shape=(codes.size, levels.size)
        )
        return np.asarray((onehot.T @ weights.T).T)

    at_pos, at_neg = per_level(w_pos, inverse[: pos.size]), per_level(w_neg, inverse[pos.size :])
    below = np.cumsum(at_neg, axis=1) - at_neg
    wins = (at_pos * (below + 0.5 * at_neg)).sum(axis=1)
    return wins / (at_pos.sum(axis=1) * at_neg.sum(axis=1))


def _class_resamples(
    y: np.ndarray, codes: np.ndarray | None, rng: np.random.Generator, n_resamples: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-example weights of the positives and the negatives in each clustered resample."""
    pos_codes = codes[y == 1] if codes is not None else np.arange(int((y == 1).sum()))
    neg_codes = codes[y == 0] if codes is not None else np.arange(int((y == 0).sum()))
    return _cluster_weights(pos_codes, rng, n_resamples), _cluster_weights(neg_codes, rng, n_resamples)


def auroc_ci(
    y_true: Sequence[int] | np.ndarray,
    scores: Sequence[float] | np.ndarray,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    level: float = DEFAULT_LEVEL,
    clusters: Sequence[Any] | np.ndarray | None = None,
) -> AurocResult:
    """AUROC and its stratified percentile-bootstrap CI (clustered when ``clusters`` is given)."""
    _check_resampling(n_resamples, level)
    y, s = _labels_scores(y_true, scores)
    codes = _cluster_codes(clusters, y.size)
    pos, neg = s[y == 1], s[y == 0]
    rng = np.random.Generator(np.random.PCG64(seed))
    if codes is None:
        boot = _auroc_rows(
            pos[rng.integers(0, pos.size, (n_resamples, pos.size))],
            neg[rng.integers(0, neg.size, (n_resamples, neg.size))],
        )
        k_pos, k_neg = int(pos.size), int(neg.size)
    else:
        w_pos, w_neg = _class_resamples(y, codes, rng, n_resamples)
        boot = _weighted_auroc_rows(pos, neg, w_pos, w_neg)
        k_pos, k_neg = np.unique(codes[y == 1]).size, np.unique(codes[y == 0]).size
    tail = (1 - level) / 2
    low, high = np.quantile(boot, [tail, 1 - tail])
    point = float(_auroc_rows(pos[None, :], neg[None, :])[0])
    return AurocResult(
        point, float(low), float(high), int(pos.size), int(neg.size), n_resamples, seed, level, int(k_pos), int(k_neg)
    )


def clopper_pearson(k: int, n: int, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval for k successes in n trials."""
    from scipy.stats import beta

    if n < 1 or not 0 <= k <= n:
        raise MemoryPoisoningInputError(f"Clopper-Pearson needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    alpha = 1 - level
    low = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return low, high


@dataclass(frozen=True)
class RateResult:
    """k of n, the rate k/n and its Clopper-Pearson interval."""

    rate: float
    ci_low: float
    ci_high: float
    k: int
    n: int
    level: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rate(k: int, n: int, level: float = DEFAULT_LEVEL) -> RateResult:
    low, high = clopper_pearson(int(k), int(n), level)
    return RateResult(int(k) / int(n), low, high, int(k), int(n), level)


@dataclass(frozen=True)
class OperatingPoint:
    """TPR (poisons flagged) and FPR (benign writes flagged) at one threshold."""

    threshold: float
    tpr: RateResult
    fpr: RateResult

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"threshold": self.threshold}
        for name, result in (("tpr", self.tpr), ("fpr", self.fpr)):
            out.update({f"{name}_{key}" if key != "rate" else name: value for key, value in result.as_dict().items()})
        return out


def operating_point(
    y_true: Sequence[int] | np.ndarray,
    scores: Sequence[float] | np.ndarray,
    threshold: float,
    *,
    level: float = DEFAULT_LEVEL,
) -> OperatingPoint:
    """TPR / FPR of ``score > threshold`` (the detectors' rule) with exact intervals."""
    y, s = _labels_scores(y_true, scores)
    flagged = s > threshold
    tp, fp = int((flagged & (y == 1)).sum()), int((flagged & (y == 0)).sum())
    return OperatingPoint(float(threshold), rate(tp, int((y == 1).sum()), level), rate(fp, int((y == 0).sum()), level))


@dataclass(frozen=True)
class BinomialTest:
    """One-sided exact test of H0: TPR ≤ tpr0 against TPR > tpr0."""

    k: int
    n: int
    tpr0: float
    p_value: float
    alpha: float
    reject: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def binomial_test_tpr(k: int, n: int, *, tpr0: float = 0.0, alpha: float = DEFAULT_ALPHA) -> BinomialTest:
    from scipy.stats import binomtest

    if n < 1 or not 0 <= k <= n:
        raise MemoryPoisoningInputError(f"binomial test needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    p = 1.0 if k == 0 else (0.0 if tpr0 == 0 else float(binomtest(k, n, tpr0, alternative="greater").pvalue))
    return BinomialTest(int(k), int(n), tpr0, p, alpha, p < alpha)


@dataclass(frozen=True)
class Comparison:
    """ΔAUROC = AUROC(a) − AUROC(b) on the same examples, tested at the Bonferroni level α/m."""

    a: str
    b: str
    auroc_a: float
    auroc_b: float
    difference: float
    ci_low: float
    ci_high: float
    p_value: float
    p_adjusted: float  # min(1, m·p)
    alpha: float
    m: int
    alpha_corrected: float  # α/m
    significant: bool
    method: str
    n_positive: int
    n_negative: int
    n_resamples: int
    seed: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _normalised_ranks(scores: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(scores) / scores.size


def compare_aurocs(
    y_true: Sequence[int] | np.ndarray,
    scores: Mapping[str, Sequence[float] | np.ndarray],
    *,
    pairs: Sequence[tuple[str, str]] | None = None,
    alpha: float = DEFAULT_ALPHA,
    method: Literal["bootstrap", "permutation"] = "bootstrap",
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    level: float = DEFAULT_LEVEL,
    clusters: Sequence[Any] | np.ndarray | None = None,
    family_size: int | None = None,
) -> list[Comparison]:
    """Every pair (or ``pairs``) of detectors compared on the same labelled examples, Bonferroni over m pairs
    (m = ``family_size`` when these pairs belong to a larger family)."""
    _check_resampling(n_resamples, level)
    if method not in ("bootstrap", "permutation"):
        raise MemoryPoisoningInputError(f"method must be 'bootstrap' or 'permutation', got {method!r}")
    if not 0 < alpha < 1:
        raise MemoryPoisoningInputError(f"alpha must be in (0, 1), got {alpha}")
    names = list(scores)
    checked = {name: _labels_scores(y_true, scores[name]) for name in names}
    pairs = list(pairs) if pairs is not None else list(itertools.combinations(names, 2))
    missing = sorted({n for pair in pairs for n in pair} - set(names))
    if missing or not pairs:
        raise MemoryPoisoningInputError(
            f"pairs name unknown detectors {missing} (have {names})" if missing else "no pairs"
        )
    if family_size is not None and family_size < len(pairs):
        raise MemoryPoisoningInputError(f"the Bonferroni family ({family_size}) is smaller than the {len(pairs)} pairs")
    y = checked[names[0]][0]
    codes = _cluster_codes(clusters, y.size)
    pos_idx, neg_idx = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    m = family_size or len(pairs)
    rng = np.random.Generator(np.random.PCG64(seed))
    if codes is None:
        boot_pos = pos_idx[rng.integers(0, pos_idx.size, (n_resamples, pos_idx.size))]
        boot_neg = neg_idx[rng.integers(0, neg_idx.size, (n_resamples, neg_idx.size))]

        def resampled(s: np.ndarray) -> np.ndarray:
            return _auroc_rows(s[boot_pos], s[boot_neg])
    else:
        w_pos, w_neg = _class_resamples(y, codes, rng, n_resamples)

        def resampled(s: np.ndarray) -> np.ndarray:
            return _weighted_auroc_rows(s[pos_idx], s[neg_idx], w_pos, w_neg)

    swap_units = codes if codes is not None else np.arange(y.size)
    results = []
    for a, b in pairs:
        sa, sb = checked[a][1], checked[b][1]
        auc_a = float(_auroc_rows(sa[pos_idx][None, :], sa[neg_idx][None, :])[0])
        auc_b = float(_auroc_rows(sb[pos_idx][None, :], sb[neg_idx][None, :])[0])
        observed = auc_a - auc_b
        boot = resampled(sa) - resampled(sb)
        tail = (1 - level) / 2
        low, high = (float(v) for v in np.quantile(boot, [tail, 1 - tail]))
        if method == "bootstrap":
            p = float((np.abs(boot - boot.mean()) >= abs(observed) - 1e-12).mean())
        else:
            ra, rb = _normalised_ranks(sa), _normalised_ranks(sb)
            perm_rng = np.random.Generator(np.random.PCG64(seed + 1))
            swap = (perm_rng.random((n_resamples, int(swap_units.max()) + 1)) < 0.5)[:, swap_units]
            pa, pb = np.where(swap, rb, ra), np.where(swap, ra, rb)
            diff = _auroc_rows(pa[:, pos_idx], pa[:, neg_idx]) - _auroc_rows(pb[:, pos_idx], pb[:, neg_idx])
            p = float((1 + (np.abs(diff) >= abs(observed) - 1e-12).sum()) / (n_resamples + 1))
        p_adj = min(1.0, p * m)
        results.append(
            Comparison(
                a,
                b,
                auc_a,
                auc_b,
                observed,
                low,
                high,
                p,
                p_adj,
                alpha,
                m,
                alpha / m,
                p < alpha / m,
                method,
                int(pos_idx.size),
                int(neg_idx.size),
                n_resamples,
                seed,
            )
        )
    return results
