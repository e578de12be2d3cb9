"""κ chosen on benign reference entries alone: the cross-validated FPR is what a brute-force replay counts."""

from __future__ import annotations

import numpy as np
import pytest

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.defenses.base import WriteContext
from rvu_pipelines.memory_poisoning.defenses.benign_kappa import kappa_on_benign
from rvu_pipelines.memory_poisoning.defenses.memsad import MemsadDetector


def _unit(rng: np.random.Generator, n: int, d: int = 16) -> np.ndarray:
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture
def context() -> WriteContext:
    rng = np.random.default_rng(7)
    return WriteContext(reference_vectors=_unit(rng, 200), reference_texts=(), history_vectors=_unit(rng, 30))


def test_the_chosen_kappa_is_the_smallest_whose_held_out_benign_fpr_meets_the_target(context) -> None:
    grid = (1.0, 1.5, 2.0, 2.5, 3.0)
    choice = kappa_on_benign(MemsadDetector, context, fpr_target=0.02, folds=5, grid=grid, seed=3)
    rates = [choice.grid_fpr[f"{k:g}"] for k in grid]
    assert rates == sorted(rates, reverse=True)  # a higher threshold never rejects more
    assert choice.met and choice.cv_fpr <= 0.02
    assert all(r > 0.02 for k, r in zip(grid, rates, strict=True) if k < choice.kappa)
    # brute force: refit per fold and count held-out reference entries above mu + kappa sigma
    assignment = np.random.default_rng(3).permutation(200) % 5
    exceed = 0
    for fold in range(5):
        train = assignment != fold
        part = WriteContext(context.reference_vectors[train], (), context.history_vectors)
        detector = MemsadDetector(1.0).fit(part)
        scores = detector.score(context.reference_vectors[~train])
        c = detector.calibration
        exceed += int((scores > c.mu + choice.kappa * c.sigma).sum())
    assert exceed / 200 == pytest.approx(choice.cv_fpr)


def test_an_unreachable_target_takes_the_largest_kappa_and_says_so(context) -> None:
    choice = kappa_on_benign(MemsadDetector, context, fpr_target=1e-9, grid=(1.0, 1.5))
    assert not choice.met and choice.kappa == 1.5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"fpr_target": 0.0}, "fpr_target"), ({"folds": 1}, "5-fold|1-fold"), ({"grid": ()}, "grid")],
)
def test_bad_settings_are_refused(context, kwargs, message) -> None:
    with pytest.raises(MemoryPoisoningInputError, match=message):
        kappa_on_benign(MemsadDetector, context, **kwargs)


def test_the_grid_stops_at_the_largest_kappa_the_reference_set_can_calibrate(context) -> None:
    """200 reference entries calibrate kappa <= 5.25 (seed 003's bound): the choice, met or not, is a kappa the
    detector can then be fitted with, never the grid's 6.0."""
    choice = kappa_on_benign(MemsadDetector, context, fpr_target=1e-9)
    assert max(float(k) for k in choice.grid_fpr) == 5.25 and choice.kappa <= 5.25
    MemsadDetector(choice.kappa).fit(context)  # fits on the whole reference set
    small = WriteContext(context.reference_vectors[:30], (), context.history_vectors)
    with pytest.raises(MemoryPoisoningInputError, match="calibrate no kappa"):
        kappa_on_benign(MemsadDetector, small)
