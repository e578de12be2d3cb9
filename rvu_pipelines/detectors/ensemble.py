"""D5: a weighted average of detector scores; seed 002 §5.2 uses 0.4 x D2 (TF-IDF) + 0.6 x D4 (fine-tuned)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rvu_pipelines.detectors.base import DetectorBase, InjectionDetector
from rvu_pipelines.errors import DetectorError

SEED_WEIGHTS = (0.4, 0.6)  # (D2, D4)


class EnsembleDetector(DetectorBase):
    """Sum of weight x member score; weights are non-negative and sum to 1, so scores stay in [0, 1].

    Not windowed itself: each member gets the whole text and windows it as its own model needs (a window
    here would be windowed again by the members, and the weighted sum would no longer be that of the
    members' text scores)."""

    def __init__(self, members: Sequence[tuple[InjectionDetector, float]], name: str = "D5 Ensemble") -> None:
        weights = np.array([w for _, w in members], dtype=np.float64)
        if not members or np.any(weights < 0) or not np.isclose(weights.sum(), 1.0):
            raise DetectorError(f"Ensemble weights must be non-negative and sum to 1; got {weights.tolist()}.")
        self.members = tuple(members)
        self.name = name

    def _score(self, texts: list[str]) -> np.ndarray:
        return combine([member.score(texts) for member, _ in self.members], [w for _, w in self.members])


def combine(scores: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """The ensemble's arithmetic on precomputed member scores (what the evaluation reuses)."""
    total = np.zeros_like(np.asarray(scores[0], dtype=np.float64))
    for member, weight in zip(scores, weights, strict=True):
        total += float(weight) * np.asarray(member, dtype=np.float64)
    return np.clip(total, 0.0, 1.0)


def seed_ensemble(tfidf: InjectionDetector, finetuned: InjectionDetector) -> EnsembleDetector:
    """D5 = 0.4 x D2 + 0.6 x D4, threshold 0.5 (seed 002 §5.2)."""
    return EnsembleDetector([(tfidf, SEED_WEIGHTS[0]), (finetuned, SEED_WEIGHTS[1])])
