"""The logistic probe learns a planted feature across sources and is at chance on noise."""

from __future__ import annotations

import numpy as np
import pytest

from rvu_pipelines.spectral import CalibrationError, SpectralInputError
from rvu_pipelines.spectral.probe import fit_probe, leave_one_dataset_out


def _sources(seed: int, planted: float, n_pairs: int = 90, n_features: int = 20) -> dict[str, np.ndarray]:
    """Three sources of (clean, injected) pairs; feature 3 moves with the label by ``planted`` (in units of
    its noise); every source has its own offset on every feature (a dataset shift)."""
    rng = np.random.default_rng(seed)
    parts = []
    for number, name in enumerate(("a", "b", "c")):
        x = rng.normal(0, 1, (2 * n_pairs, n_features)) + rng.normal(0, 2, n_features)
        y = np.tile([0, 1], n_pairs)
        x[:, 3] += planted * y
        parts.append((x, y, np.full(2 * n_pairs, name), np.repeat(np.arange(n_pairs) + 1000 * number, 2)))
    x, y, s, g = (np.concatenate(p) for p in zip(*parts, strict=True))
    splits = np.where(np.repeat(np.arange(len(y) // 2) % 3 == 0, 2), "heldout", "calibration")
    return {"features": x, "labels": y, "sources": s, "groups": g, "splits": splits}


def test_lodo_learns_a_planted_feature() -> None:
    data = _sources(0, planted=3.0)
    results = leave_one_dataset_out(**data, n_boot=200)
    assert [r.source for r in results] == ["a", "b", "c"]
    for r in results:
        assert r.paired and r.auroc.value > 0.85 and r.auroc.low > 0.7, r
        assert r.n_train == int(((data["sources"] != r.source) & (data["splits"] == "calibration")).sum())


def test_lodo_is_at_chance_on_noise() -> None:
    results = leave_one_dataset_out(**_sources(1, planted=0.0), n_boot=200)
    assert np.mean([r.auroc.value for r in results]) == pytest.approx(0.5, abs=0.12)
    assert all(r.auroc.low < 0.5 < r.auroc.high for r in results)


def test_probe_checks_its_input() -> None:
    data = _sources(2, planted=1.0)
    x, y, g = data["features"], data["labels"], data["groups"]
    probe = fit_probe(x, y, g)
    assert probe.score(x).shape == y.shape and probe.C > 0
    bad = x.copy()
    bad[0, 5] = np.nan
    with pytest.raises(SpectralInputError, match="columns \\[5\\]"):
        fit_probe(bad, y, g)
    with pytest.raises(CalibrationError):
        fit_probe(x, np.zeros_like(y), g)
    with pytest.raises(CalibrationError):
        leave_one_dataset_out(x, y, np.full(y.size, "a"), g)
