"""D2: character n-gram TF-IDF + class-balanced logistic regression, with seed 002's settings (§5.2, §11.3).

A bag of n-grams has no window, but a long benign text dilutes an injection's n-grams until the model no
longer sees them; a text of more than ``WINDOW_WORDS`` whitespace-separated words is therefore scored in
windows of that many words, ``WINDOW_STRIDE`` apart, and its score is the aggregate of its windows' scores
(max by default; see :class:`~rvu_pipelines.detectors.base.DetectorBase`).

Saved only in skops format and loaded only after skops reports no type outside its default safe set,
so a tampered model file cannot run code (no pickle).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rvu_pipelines.detectors.base import DetectorBase, Span
from rvu_pipelines.detectors.registry_formats import (
    KIND_KEY,
    NAME_KEY,
    RegistryFormat,
    pinned_requirements,
    register_format,
)
from rvu_pipelines.errors import DetectorError, RegisteredDetectorError, UnsafePickleError
from rvu_pipelines.text_windows import char_spans

# Seed 002 §11.3: char n-grams (1, 4), max 15,000 features, sublinear TF, no lowercasing (§5.1:
# "whitespace normalization only"); L-BFGS, balanced class weights, C = 1.0, random_state 42.
TFIDF_SETTINGS: dict[str, Any] = {
    "analyzer": "char",
    "ngram_range": (1, 4),
    "max_features": 15_000,
    "sublinear_tf": True,
    "lowercase": False,
}
LOGREG_SETTINGS: dict[str, Any] = {
    "solver": "lbfgs",
    "class_weight": "balanced",
    "C": 1.0,
    "random_state": 42,
    "max_iter": 1000,
}
WINDOW_WORDS = 128
WINDOW_STRIDE = 64
_WORD = re.compile(r"\S+")


def build_pipeline() -> Any:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    return Pipeline([("tfidf", TfidfVectorizer(**TFIDF_SETTINGS)), ("logreg", LogisticRegression(**LOGREG_SETTINGS))])


class TfidfDetector(DetectorBase):
    """D2 around a fitted scikit-learn pipeline (``tfidf`` -> ``logreg``), windowed by words (module doc)."""

    name = "D2 TF-IDF+LR"

    def __init__(self, pipeline: Any, fit_seconds: float | None = None) -> None:
        classes = list(getattr(pipeline, "classes_", []))
        if classes != [0, 1]:
            raise DetectorError(f"A D2 pipeline must be fitted on labels [0, 1]; it has classes {classes}.")
        self.pipeline = pipeline
        self.fit_seconds = fit_seconds

    @classmethod
    def train(cls, texts: Sequence[str], labels: Sequence[int] | np.ndarray) -> TfidfDetector:
        y = np.asarray(labels, dtype=np.int64)
        if len(texts) != len(y) or set(np.unique(y).tolist()) != {0, 1}:
            raise DetectorError(
                f"D2 needs one 0/1 label per text with both labels present; got {len(texts)} texts, "
                f"labels {sorted(set(y.tolist()))}."
            )
        pipeline = build_pipeline()
        start = time.perf_counter()
        pipeline.fit(list(texts), y)
        return cls(pipeline, fit_seconds=time.perf_counter() - start)

    def _window_spans(self, text: str) -> list[Span]:
        words = [match.span() for match in _WORD.finditer(text)]
        if len(words) <= WINDOW_WORDS:
            return [(0, len(text))]
        return char_spans(words, WINDOW_WORDS, WINDOW_STRIDE)

    def _score(self, texts: list[str]) -> np.ndarray:
        return self.pipeline.predict_proba(texts)[:, 1]

    @staticmethod
    def params() -> dict[str, object]:
        return {
            **{f"tfidf_{k}": v for k, v in TFIDF_SETTINGS.items()},
            **{f"logreg_{k}": v for k, v in LOGREG_SETTINGS.items()},
        }

    def save(self, path: Path) -> Path:
        import skops.io

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        skops.io.dump(self.pipeline, path)
        return path

    @classmethod
    def load(cls, path: Path) -> TfidfDetector:
        return cls(load_skops(Path(path)))


def load_skops(path: Path) -> Any:
    """Load a skops file only if every type in it is in skops' default trusted set (no extra trust)."""
    import skops.io

    if not path.is_file():
        raise DetectorError(f"No D2 model file at {path}.")
    untrusted = skops.io.get_untrusted_types(file=path)
    if untrusted:
        raise UnsafePickleError(
            f"{path} references types outside the trusted set: {sorted(untrusted)}; refused. "
            "Only a TF-IDF + logistic-regression pipeline is accepted."
        )
    return skops.io.load(path, trusted=[])


def _save_registered(detector: TfidfDetector, folder: Path) -> None:
    """D2 with MLflow's sklearn flavour in skops format (no pickle)."""
    import mlflow.sklearn

    mlflow.sklearn.save_model(
        detector.pipeline,
        str(folder),
        serialization_format="skops",
        pip_requirements=pinned_requirements("scikit-learn", "skops"),
        metadata={KIND_KEY: D2_FORMAT_TAG, NAME_KEY: detector.name},
    )


def _load_registered(folder: Path, mlmodel: dict) -> TfidfDetector:
    flavor = mlmodel.get("flavors", {}).get("sklearn", {})
    if flavor.get("serialization_format") != "skops":
        raise RegisteredDetectorError(f"{folder} is not stored in skops format; refused (no pickle).")
    return TfidfDetector.load(folder / flavor["pickled_model"])


D2_FORMAT_TAG = "d2-tfidf-skops"
register_format(RegistryFormat("d2", D2_FORMAT_TAG, TfidfDetector, _save_registered, _load_registered))
