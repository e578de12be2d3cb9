"""The seed's OOD baselines (Energy, Mahalanobis, kNN) and two it lacks (spectral signatures, TrustRAG).

Every baseline is a ``WriteDetector`` calibrated like MEMSAD: its scores on the benign reference entries
give µ̂, σ̂ and the threshold µ̂ + κσ̂ (κ = 2.0; ``memsad.calibrate``, same minimum-N rule). Where a
detector is fitted on the reference set itself, the reference scores it calibrates on are out-of-sample
(leave-one-out for kNN, 5-fold cross-fitting for Mahalanobis), so the threshold is not set on scores
the fit has already seen.

- ``EnergyDetector`` (Liu et al. 2020, as the seed adapts it): the free energy of the candidate's
  similarities to the query history, E(c) = −T log Σ_q exp(cos(c, q)/T). A poison is anomalous by being
  *close* to the queries, so the anomaly score is the negative energy −E(c) = T·logsumexp(cos/T), a soft
  maximum of the similarities. T = 1.0 as in the seed's released code (the paper prints only the
  formula); at T = 1 it behaves like the mean similarity plus half its variance, as T → 0 like the max.
  ``against="memory"`` uses the memory entries instead of H.
- ``MahalanobisDetector`` (Lee et al. 2018): squared Mahalanobis distance to the reference mean under
  the Ledoit-Wolf shrunk covariance (scikit-learn); 384 dimensions from ~200 entries need the shrinkage.
- ``KnnDetector``: 1 − mean cosine of the k = 10 nearest reference entries (or memory entries with
  ``against="memory"``); far from benign data = anomalous.
- ``SpectralSignatureDetector`` (Tran et al. 2018): centre the embeddings of memory + candidate batch,
  take the top right singular vector v, score = ((x − mean) · v)^2. A batch of similar poisons pulls v
  towards itself. Transductive: score the whole write batch in one call (a lone write barely moves v).
- ``TrustRagFilter`` (Zhou et al. 2025, arXiv 2501.00879, stage 1 moved to write time): k-means (k = 2)
  on the standardised, re-normalised embeddings of the candidate batch; per candidate, the mean pairwise
  cosine of its cluster (TrustRAG drops a cluster above 0.88) and its highest ROUGE-L F1 with another
  member of its cluster (TrustRAG's n-gram filter, 0.25). Score = ½·density/0.88 + ½·ROUGE-L/0.25, so an
  exact duplicate cluster scores ≈ 2.6 and TrustRAG's own cut-offs sit at 1. Also transductive; a batch of
  one scores 0 (TrustRAG, too, needs two poisons in the retrieved set). ROUGE-L here is the LCS F1 on
  lower-cased word tokens, without the stemmer of the rouge-score package.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.defense_catalog import write_defense
from rvu_pipelines.memory_poisoning.defenses.base import WriteContext
from rvu_pipelines.memory_poisoning.defenses.memsad import (
    DEFAULT_KAPPA,
    CalibratedThreshold,
    Calibration,
    calibrate,
    candidate_matrix,
    check_kappa,
    history_matrix,
    reference_matrix,
)
from rvu_pipelines.memory_poisoning.retrieval import check_embeddings

DEFAULT_TEMPERATURE = 1.0
DEFAULT_K = 10
CROSS_FIT_FOLDS = 5
TRUSTRAG_COSINE = 0.88
TRUSTRAG_ROUGE = 0.25
TRUSTRAG_ROUGE_NEIGHBOURS = 5  # ROUGE-L is computed against a candidate's 5 nearest cluster-mates only
SEED = 0
_WORD = re.compile(r"[a-z0-9]+")


def single_threaded() -> Any:
    """BLAS / OpenMP limited to one thread: the matrices here are small (a few hundred rows of 384), where
    thread start-up and spin-waiting cost more than they save, and on a loaded small machine far more
    (a 6-fold Ledoit-Wolf fit is many times slower with two spinning threads than with one)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


def word_tokens(text: str) -> list[str]:
    """Lower-cased alphanumeric word tokens (what ROUGE-L and the lexical features compare)."""
    return _WORD.findall(text.lower())


def rouge_l(a: Sequence[str], b: Sequence[str]) -> float:
    """ROUGE-L F1 of two token sequences: LCS length / len, harmonic mean of precision and recall."""
    from rapidfuzz.distance import LCSseq

    if not a or not b:
        return 0.0
    lcs = LCSseq.similarity(a, b)  # the longest common subsequence of the two token lists (bit-parallel)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / min(len(a), len(b)), lcs / max(len(a), len(b))
    return 2 * precision * recall / (precision + recall)


class _Calibrated(CalibratedThreshold):
    """Threshold bookkeeping shared by the baselines."""

    name: str
    kappa: float
    _calibration: Calibration | None = None
    _dimension: int = 0
    reference_scores: np.ndarray = np.zeros(0)

    def _set_calibration(self, scores: np.ndarray, n_history: int = 0) -> None:
        self.reference_scores = np.asarray(scores, dtype=np.float64)
        self._calibration = calibrate(self.reference_scores, self.kappa, detector=self.name, n_history=n_history)

    def _candidates(self, vectors: np.ndarray) -> np.ndarray:
        self.calibration  # noqa: B018 - raises when not fitted
        return candidate_matrix(vectors, self._dimension, self.name)

    def score(self, vectors: np.ndarray, texts: Sequence[str] = ()) -> np.ndarray:
        raise NotImplementedError

    def flags(self, vectors: np.ndarray, texts: Sequence[str] = ()) -> np.ndarray:
        return self.score(vectors, texts) > self.threshold


def _memory(context: WriteContext, dimension: int, detector: str) -> np.ndarray:
    vectors = context.memory_vectors
    if vectors is None or np.asarray(vectors).shape[0] == 0:
        raise MemoryPoisoningInputError(f"{detector}: against='memory' needs the context's memory_vectors; none given")
    array = np.asarray(vectors)
    return check_embeddings(array, array.shape[0], dimension, f"{detector} memory")


class EnergyDetector(_Calibrated):
    """Negative free energy T·logsumexp(cos(c, ·)/T) over the query history (or the memory)."""

    def __init__(
        self,
        kappa: float = DEFAULT_KAPPA,
        *,
        temperature: float = DEFAULT_TEMPERATURE,
        against: Literal["history", "memory"] = "history",
        name: str = "energy",
    ) -> None:
        if not temperature > 0:
            raise MemoryPoisoningInputError(f"energy temperature must be positive, got {temperature}")
        if against not in ("history", "memory"):
            raise MemoryPoisoningInputError(f"against must be 'history' or 'memory', got {against!r}")
        self.kappa, self.temperature, self.against, self.name = check_kappa(kappa), float(temperature), against, name
        self._anchors = np.zeros((0, 0), dtype=np.float32)

    def fit(self, context: WriteContext) -> EnergyDetector:
        reference = reference_matrix(context, self.name)
        self._dimension = reference.shape[1]
        if self.against == "history":
            self._anchors = history_matrix(context.history_vectors, self._dimension, self.name)
        else:
            self._anchors = _memory(context, self._dimension, self.name)
        self._set_calibration(self._energy(reference), n_history=self._anchors.shape[0])
        return self

    def _energy(self, candidates: np.ndarray) -> np.ndarray:
        scaled = (candidates @ self._anchors.T).astype(np.float64) / self.temperature
        top = scaled.max(axis=1, keepdims=True)
        return self.temperature * (top[:, 0] + np.log(np.exp(scaled - top).sum(axis=1)))

    def score(self, vectors: np.ndarray, texts: Sequence[str] = ()) -> np.ndarray:
        candidates = self._candidates(vectors)
        return self._energy(candidates) if candidates.shape[0] else np.zeros(0)


class MahalanobisDetector(_Calibrated):
    """Squared Mahalanobis distance to the benign reference distribution (Ledoit-Wolf covariance)."""

    def __init__(
        self, kappa: float = DEFAULT_KAPPA, *, folds: int = CROSS_FIT_FOLDS, name: str = "mahalanobis"
    ) -> None:
        if folds < 2:
            raise MemoryPoisoningInputError(f"cross-fitting needs at least 2 folds, got {folds}")
        self.kappa, self.folds, self.name = check_kappa(kappa), int(folds), name
        self._mean = np.zeros(0)
        self._precision = np.zeros((0, 0))

    @staticmethod
    def _fit_moments(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from sklearn.covariance import LedoitWolf

        model = LedoitWolf().fit(vectors.astype(np.float64))
        return model.location_, model.precision_

    @staticmethod
    def _distance(vectors: np.ndarray, mean: np.ndarray, precision: np.ndarray) -> np.ndarray:
        diff = vectors.astype(np.float64) - mean
        return np.einsum("ij,jk,ik->i", diff, precision, diff)

    def fit(self, context: WriteContext) -> MahalanobisDetector:
        reference = reference_matrix(context, self.name)
        self._dimension = reference.shape[1]
        if reference.shape[0] < 2 * self.folds:
            raise MemoryPoisoningInputError(
                f"{self.name}: {reference.shape[0]} reference entries cannot be split into {self.folds} folds"
            )
        order = np.random.default_rng(SEED).permutation(reference.shape[0])
        held_out = np.empty(reference.shape[0])
        with single_threaded():
            for fold in np.array_split(order, self.folds):  # cross-fitted: each entry scored by a fit without it
                rest = np.setdiff1d(order, fold)
                mean, precision = self._fit_moments(reference[rest])
                held_out[fold] = self._distance(reference[fold], mean, precision)
            self._mean, self._precision = self._fit_moments(reference)
        self._set_calibration(held_out)
        return self

    def score(self, vectors: np.ndarray, texts: Sequence[str] = ()) -> np.ndarray:
        candidates = self._candidates(vectors)
        return self._distance(candidates, self._mean, self._precision) if candidates.shape[0] else np.zeros(0)


class KnnDetector(_Calibrated):
    """1 − mean cosine to the k nearest reference (or memory) entries."""

    def __init__(
        self,
        kappa: float = DEFAULT_KAPPA,
        *,
        k: int = DEFAULT_K,
        against: Literal["reference", "memory"] = "reference",
        name: str = "knn",
    ) -> None:
        if k < 1:
            raise MemoryPoisoningInputError(f"k must be at least 1, got {k}")
        if against not in ("reference", "memory"):
            raise MemoryPoisoningInputError(f"against must be 'reference' or 'memory', got {against!r}")
        self.kappa, self.k, self.against, self.name = check_kappa(kappa), int(k), against, name
        self._pool = np.zeros((0, 0), dtype=np.float32)

    def _distances(self, candidates: np.ndarray, *, exclude_self: bool = False) -> np.ndarray:
        sims = (candidates @ self._pool.T).astype(np.float64)
        if exclude_self:  # leave-one-out: a reference entry is not its own neighbour
            np.fill_diagonal(sims, -np.inf)
        k = min(self.k, self._pool.shape[0] - (1 if exclude_self else 0))
        top = -np.partition(-sims, k - 1, axis=1)[:, :k]
        return 1.0 - top.mean(axis=1)

    def fit(self, context: WriteContext) -> KnnDetector:
        reference = reference_matrix(context, self.name)
        self._dimension = reference.shape[1]
        if self.against == "reference":
            if reference.shape[0] <= self.k:
                raise MemoryPoisoningInputError(
                    f"{self.name}: k={self.k} needs more than {self.k} reference entries, got {reference.shape[0]}"
                )
            self._pool = reference
            self._set_calibration(self._distances(reference, exclude_self=True))
        else:
            self._pool = _memory(context, self._dimension, self.name)
            self._set_calibration(self._distances(reference))
        return self

    def score(self, vectors: np.ndarray, texts: Sequence[str] = ()) -> np.ndarray:
        candidates = self._candidates(vectors)
        return self._distances(candidates) if candidates.shape[0] else np.zeros(0)


class SpectralSignatureDetector(_Calibrated):
    """Tran et al. 2018: squared projection on the top singular vector of centred memory + batch embeddings."""

    def __init__(self, kappa: float = DEFAULT_KAPPA, *, name: str = "spectral") -> None:
        self.kappa, self.name = check_kappa(kappa), name
        self._base = np.zeros((0, 0), dtype=np.float32)

    def fit(self, context: WriteContext) -> SpectralSignatureDetector:
        reference = reference_matrix(context, self.name)
        self._dimension = reference.shape[1]
        memory = context.memory_vectors
        if memory is not None and np.asarray(memory).shape[0] > 0:
            self._base = _memory(context, self._dimension, self.name)
        else:
            self._base = np.zeros((0, self._dimension), dtype=np.float32)
        self._set_calibration(self._spectral(reference))
        return self

    def _spectral(self, candidates: np.ndarray) -> np.ndarray:
        stacked = np.vstack([self._base, candidates]).astype(np.float64)
        centred = stacked - stacked.mean(axis=0)
        with single_threaded():
            _, _, vt = np.linalg.svd(centred, full_matrices=False)
        projection = centred[self._base.shape[0] :] @ vt[0]
        return projection**2

    def score(self, vectors: np.ndarray, texts: Sequence[str] = ()) -> np.ndarray:
        candidates = self._candidates(vectors)
        return self._spectral(candidates) if candidates.shape[0] else np.zeros(0)


class TrustRagFilter(_Calibrated):
    """TrustRAG stage 1 at write time: k-means density + ROUGE-L among the candidate batch."""

    def __init__(
        self,
        kappa: float = DEFAULT_KAPPA,
        *,
        cosine_threshold: float = TRUSTRAG_COSINE,
        rouge_threshold: float = TRUSTRAG_ROUGE,
        neighbours: int = TRUSTRAG_ROUGE_NEIGHBOURS,
        name: str = "trustrag",
    ) -> None:
        if not (0 < cosine_threshold <= 1 and 0 < rouge_threshold <= 1):
            raise MemoryPoisoningInputError("TrustRAG cut-offs must be in (0, 1]")
        self.kappa, self.name = check_kappa(kappa), name
        self.cosine_threshold, self.rouge_threshold = float(cosine_threshold), float(rouge_threshold)
        self.neighbours = int(neighbours)

    def fit(self, context: WriteContext) -> TrustRagFilter:
        reference = reference_matrix(context, self.name)
        self._dimension = reference.shape[1]
        texts = list(context.reference_texts)
        if len(texts) != reference.shape[0]:
            raise MemoryPoisoningInputError(
                f"{self.name}: {len(texts)} reference texts for {reference.shape[0]} reference vectors; "
                "TrustRAG's n-gram filter needs the texts"
            )
        self._set_calibration(self._trustrag(reference, texts))
        return self

    def clusters(self, candidates: np.ndarray) -> np.ndarray:
        """TrustRAG's k-means (k = 2) labels on standardised, re-normalised embeddings."""
        n = candidates.shape[0]
        if n < 3:
            return np.zeros(n, dtype=np.int64)
        from sklearn.cluster import KMeans

        x = candidates.astype(np.float64)
        x = (x - x.mean(axis=0)) / np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0)
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        with single_threaded():
            return KMeans(n_clusters=2, n_init=10, max_iter=500, random_state=SEED).fit(x).labels_

    def components(self, candidates: np.ndarray, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(cluster density, best in-cluster ROUGE-L F1) per candidate."""
        n = candidates.shape[0]
        labels = self.clusters(candidates)
        sims = (candidates @ candidates.T).astype(np.float64)
        tokens = [word_tokens(t) for t in texts]
        density, rouge = np.zeros(n), np.zeros(n)
        for label in np.unique(labels):
            members = np.flatnonzero(labels == label)
            if members.size < 2:
                continue
            block = sims[np.ix_(members, members)]
            density[members] = (block.sum() - np.trace(block)) / (members.size * (members.size - 1))
            np.fill_diagonal(block, -np.inf)
            for row, i in enumerate(members):
                nearest = members[np.argsort(-block[row])[: min(self.neighbours, members.size - 1)]]
                rouge[i] = max(rouge_l(tokens[i], tokens[j]) for j in nearest)
        return density, rouge

    def _trustrag(self, candidates: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        if len(texts) != candidates.shape[0]:
            raise MemoryPoisoningInputError(
                f"{self.name}: {len(texts)} texts for {candidates.shape[0]} candidates; pass one text per vector"
            )
        density, rouge = self.components(candidates, texts)
        return 0.5 * density / self.cosine_threshold + 0.5 * rouge / self.rouge_threshold

    def score(self, vectors: np.ndarray, texts: Sequence[str] = ()) -> np.ndarray:
        candidates = self._candidates(vectors)
        return self._trustrag(candidates, list(texts)) if candidates.shape[0] else np.zeros(0)


BASELINES: dict[str, type[_Calibrated]] = {
    "energy": EnergyDetector,
    "mahalanobis": MahalanobisDetector,
    "knn": KnnDetector,
    "spectral": SpectralSignatureDetector,
    "trustrag": TrustRagFilter,
}


@write_defense("energy", in_paper=True)
def energy_defense(kappa: float, composite_kappa: float) -> EnergyDetector:
    return EnergyDetector(kappa)


@write_defense("mahalanobis", in_paper=True)
def mahalanobis_defense(kappa: float, composite_kappa: float) -> MahalanobisDetector:
    return MahalanobisDetector(kappa)


@write_defense("knn", in_paper=True)
def knn_defense(kappa: float, composite_kappa: float) -> KnnDetector:
    return KnnDetector(kappa)


@write_defense("spectral")
def spectral_defense(kappa: float, composite_kappa: float) -> SpectralSignatureDetector:
    return SpectralSignatureDetector(kappa)


@write_defense("trustrag")
def trustrag_defense(kappa: float, composite_kappa: float) -> TrustRagFilter:
    return TrustRagFilter(kappa)
