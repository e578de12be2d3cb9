"""D2 with the paper's settings on deepset's real split, saved and loaded through skops only."""

from __future__ import annotations

import numpy as np
import pytest

from rvu_pipelines.detectors import TfidfDetector
from rvu_pipelines.detectors.metrics import point_metrics
from rvu_pipelines.detectors.tfidf import LOGREG_SETTINGS, TFIDF_SETTINGS
from rvu_pipelines.errors import DetectorError, UnsafePickleError


def test_seed_settings() -> None:
    assert TFIDF_SETTINGS == {
        "analyzer": "char",
        "ngram_range": (1, 4),
        "max_features": 15_000,
        "sublinear_tf": True,
        "lowercase": False,
    }
    assert LOGREG_SETTINGS["solver"] == "lbfgs" and LOGREG_SETTINGS["class_weight"] == "balanced"
    assert LOGREG_SETTINGS["C"] == 1.0 and LOGREG_SETTINGS["random_state"] == 42


def test_d2_on_deepset_is_deterministic_and_useful(d2_deepset, deepset) -> None:
    texts, y = deepset.texts("test"), deepset.labels("test")
    scores = d2_deepset.score(texts)
    metrics = point_metrics(y, scores)
    assert metrics["auroc"] > 0.95 and metrics["f1"] > 0.8  # seed: F1 90.09, AUROC 97.44
    again = TfidfDetector.train(deepset.texts("train"), deepset.labels("train"))
    assert np.array_equal(again.score(texts), scores)
    assert len(d2_deepset.pipeline.named_steps["tfidf"].vocabulary_) == 15_000


def test_skops_round_trip(tiny_d2, deepset, tmp_path) -> None:
    path = tiny_d2.save(tmp_path / "d2.skops")
    loaded = TfidfDetector.load(path)
    texts = deepset.texts("test")[:20]
    assert np.array_equal(loaded.score(texts), tiny_d2.score(texts))


def test_skops_file_with_untrusted_types_is_refused(tmp_path) -> None:
    import functools

    import skops.io  # here, not at collection: importing it walks scikit-learn's modules (seconds, on every worker)

    skops.io.dump(functools.partial(print, "pwned"), tmp_path / "evil.skops")  # callables are not trusted
    with pytest.raises(UnsafePickleError, match="builtins.print"):
        TfidfDetector.load(tmp_path / "evil.skops")


def test_training_errors_are_clear() -> None:
    with pytest.raises(DetectorError, match="both labels"):
        TfidfDetector.train(["a", "b"], [1, 1])
