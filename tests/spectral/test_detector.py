"""``hfer`` as an InjectionDetector: calibrated on real calibration examples, scored on held-out ones."""

from __future__ import annotations

import numpy as np
import polars as pl

from rvu_pipelines.detectors.base import InjectionDetector
from rvu_pipelines.spectral.detector import HferDetector


def test_hfer_detector_calibrates_and_scores(spectral_model, spectral_sets) -> None:
    examples = spectral_sets["context_verification"]  # short texts: the test stays fast
    detector = HferDetector.calibrated(spectral_model, examples, size=8, layers=[2, 3])
    assert isinstance(detector, InjectionDetector) and detector.name == "hfer"
    assert detector.switch.layer in (2, 3) and detector.switch.n_calibration == 8
    held = examples.filter(pl.col("split") == "heldout").head(4)
    texts = held["text"].to_list()
    scores = detector.score(texts)
    assert scores.shape == (4,) and np.all((scores >= 0) & (scores <= 1))
    # predict at 0.5 is exactly the switch firing on the same features
    fired = np.array([bool(detector.switch.fires(detector.features(t))[0]) for t in texts])
    assert np.array_equal(detector.predict(texts), fired)
    assert detector.version.startswith(spectral_model.name)
