"""The one plug-in interface every injection detector implements, and adapters for its consumers.

The recovery pipeline (``recover(..., detector)``: it scores the content of each action record and
records the detector's ``name`` and, if set, ``version`` in the certificate), the attack harness and,
through :func:`as_text_scorer`, the memory monitor's USER-channel content check all take an
:class:`InjectionDetector`; whether it is a regex list, a registered MLflow model or a fine-tuned
transformer is invisible to them. Scores are probabilities of "injection" in [0, 1].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from rvu_pipelines.errors import DetectorError

DEFAULT_THRESHOLD = 0.5


@runtime_checkable
class InjectionDetector(Protocol):
    """P(injection | text) for a batch of texts, deterministically; ``predict`` thresholds it."""

    name: str

    def score(self, texts: Sequence[str]) -> np.ndarray: ...

    def predict(self, texts: Sequence[str], threshold: float = DEFAULT_THRESHOLD) -> np.ndarray: ...


class DetectorBase:
    """Shared ``predict`` and input checks, so each detector only writes ``_score``."""

    name: str = "detector"

    def score(self, texts: Sequence[str]) -> np.ndarray:
        checked = check_texts(texts, self.name)
        if not checked:
            return np.zeros(0, dtype=np.float64)
        return check_scores(self._score(checked), len(checked), self.name)

    def predict(self, texts: Sequence[str], threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
        return self.score(texts) >= check_threshold(threshold)

    def _score(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError


class MemoizedDetector:
    """A deterministic detector that scores each distinct text once.

    In an attack cell the same tool output is scored by the classifier defense, by the provenance
    flags and by recovery's contamination signal, and recurs across defenses; a transformer detector
    (NanoGuard: ~170 ms a text on 2 cores) need not see it again. Other attributes (``name``,
    ``registered``) are the wrapped detector's.
    """

    # Declared for type checkers only (no class attribute is created): at run time both come from the
    # wrapped detector through ``__getattr__``, and ``version`` stays absent where the wrapped one has none.
    name: str
    version: str

    def __init__(self, detector: InjectionDetector) -> None:
        self.detector = detector
        self._scores: dict[str, float] = {}

    def __getattr__(self, item: str) -> object:
        if item == "detector":  # not yet set (copy/unpickle): do not recurse
            raise AttributeError(item)
        return getattr(self.detector, item)

    def score(self, texts: Sequence[str]) -> np.ndarray:
        checked = check_texts(texts, getattr(self.detector, "name", "detector"))
        missing = [text for text in dict.fromkeys(checked) if text not in self._scores]
        if missing:
            self._scores.update(zip(missing, (float(s) for s in self.detector.score(missing)), strict=True))
        return np.array([self._scores[text] for text in checked], dtype=np.float64)

    def predict(self, texts: Sequence[str], threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
        return self.score(texts) >= check_threshold(threshold)


def check_texts(texts: Sequence[str], who: str = "detector") -> list[str]:
    """A list of strings; a bare string is refused (it would be scored character by character)."""
    if isinstance(texts, (str, bytes)):
        raise DetectorError(
            f"{who}.score expects a list of texts, got a single {type(texts).__name__}; wrap it: score([text])."
        )
    checked = list(texts)
    bad = [i for i, text in enumerate(checked) if not isinstance(text, str)]
    if bad:
        raise DetectorError(
            f"{who}.score expects strings; items {bad[:5]} are {sorted({type(checked[i]).__name__ for i in bad})}."
        )
    return checked


def check_scores(scores: object, n: int, who: str) -> np.ndarray:
    """Float64 probabilities of shape (n,), or a DetectorError naming the detector that broke them."""
    array = np.asarray(scores, dtype=np.float64).reshape(-1)
    if array.shape != (n,):
        raise DetectorError(f"{who} returned {array.shape[0]} scores for {n} texts.")
    if not np.all(np.isfinite(array)) or array.min(initial=0.0) < 0.0 or array.max(initial=0.0) > 1.0:
        raise DetectorError(f"{who} returned scores outside [0, 1] (or NaN); a detector must return probabilities.")
    return array


def check_threshold(threshold: float) -> float:
    if not 0.0 <= float(threshold) <= 1.0:
        raise DetectorError(f"Invalid threshold {threshold}: allowed values are 0.0 to 1.0.")
    return float(threshold)


def as_contamination_detector(
    detector: InjectionDetector, threshold: float = DEFAULT_THRESHOLD
) -> Callable[[str], bool]:
    """``text -> is it an injection?`` at ``threshold``, from any detector (registered or not), for a
    caller that needs a yes/no filter; recovery and the attack harness take the detector itself."""
    limit = check_threshold(threshold)

    def is_contaminated(text: str) -> bool:
        return bool(detector.score([text])[0] >= limit)

    is_contaminated.__name__ = f"contaminated_by_{detector.name}"
    return is_contaminated


def as_text_scorer(detector: InjectionDetector) -> Callable[[str], float]:
    """``text -> P(injection)``: fits the memory monitor's ``ScoreContentCheck(name, score)``."""

    def score_one(text: str) -> float:
        return float(detector.score([text])[0])

    return score_one
