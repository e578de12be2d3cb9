"""κ chosen on benign data only: the smallest κ whose cross-validated benign false-positive rate meets a target.

A detector's threshold is µ̂ + κσ̂ of its scores on the benign reference entries. Which κ to use is itself
a choice, and a choice made while looking at attack results would let the evaluation leak into the
defense. Here the reference entries are split into folds; each fold is held out in turn, the detector is
fitted on the rest, and the held-out benign entries' scores give, for every κ on the grid, how many a
threshold µ̂ + κσ̂ would have rejected. The pooled rate is the benign FPR estimate; the smallest κ at or
under ``fpr_target`` is taken (the largest on the grid, flagged ``met=False``, when none is). The grid is
cut to the κ the reference set can calibrate (seed 003's bound: 200 entries support κ up to 5.25), so the
choice can always be fitted on the whole reference set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import numpy as np

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.defenses.base import WriteContext, WriteDetector
from rvu_pipelines.memory_poisoning.defenses.memsad import Calibration, minimum_calibration_size

KAPPA_GRID: tuple[float, ...] = tuple(round(1.5 + 0.25 * i, 2) for i in range(19))  # 1.5 .. 6.0


class CalibratedDetector(WriteDetector, Protocol):
    """A write detector whose threshold is µ̂ + κσ̂ of its benign reference scores."""

    @property
    def calibration(self) -> Calibration: ...


@dataclass(frozen=True)
class KappaChoice:
    kappa: float
    fpr_target: float
    cv_fpr: float  # pooled held-out benign FPR at the chosen κ
    met: bool
    folds: int
    n_reference: int
    grid_fpr: dict[str, float]  # κ -> pooled held-out benign FPR

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def kappa_on_benign(
    factory: Callable[[float], CalibratedDetector],
    context: WriteContext,
    *,
    fpr_target: float = 0.01,
    folds: int = 5,
    grid: Sequence[float] = KAPPA_GRID,
    seed: int = 0,
) -> KappaChoice:
    """Cross-validate ``factory(κ)`` on ``context``'s reference entries (see module doc); no attack data."""
    if not 0 < fpr_target < 1:
        raise MemoryPoisoningInputError(f"fpr_target must be in (0, 1), got {fpr_target!r}")
    kappas = sorted(float(k) for k in grid)
    if not kappas or kappas[0] <= 0:
        raise MemoryPoisoningInputError(f"the kappa grid must hold positive values, got {list(grid)}")
    vectors = np.asarray(context.reference_vectors)
    texts = tuple(context.reference_texts)
    n = vectors.shape[0]
    kappas = [k for k in kappas if minimum_calibration_size(k) <= n]
    if not kappas:
        raise MemoryPoisoningInputError(
            f"{n} reference entries calibrate no kappa on the grid {list(grid)} (the smallest needs "
            f"{minimum_calibration_size(min(float(k) for k in grid))}); add reference entries"
        )
    if folds < 2 or n < 2 * folds:
        raise MemoryPoisoningInputError(f"{folds}-fold selection needs at least {2 * folds} reference entries, got {n}")
    if texts and len(texts) != n:
        raise MemoryPoisoningInputError(f"{len(texts)} reference texts for {n} reference vectors")
    assignment = np.random.default_rng(seed).permutation(n) % folds
    exceed = np.zeros(len(kappas))
    for fold in range(folds):
        train, held = np.flatnonzero(assignment != fold), np.flatnonzero(assignment == fold)
        fitted = replace(
            context,
            reference_vectors=vectors[train],
            reference_texts=tuple(texts[i] for i in train) if texts else (),
        )
        detector = factory(kappas[0])
        detector.fit(fitted)
        held_texts = [texts[i] for i in held] if texts else [""] * len(held)
        scores = np.asarray(detector.score(vectors[held], held_texts), dtype=np.float64)
        calibration = detector.calibration
        exceed += np.array([(scores > calibration.mu + k * calibration.sigma).sum() for k in kappas])
    rates = exceed / n
    ok = [i for i, r in enumerate(rates) if r <= fpr_target]
    pick = ok[0] if ok else len(kappas) - 1
    return KappaChoice(
        kappa=kappas[pick],
        fpr_target=fpr_target,
        cv_fpr=float(rates[pick]),
        met=bool(ok),
        folds=folds,
        n_reference=n,
        grid_fpr={f"{k:g}": float(r) for k, r in zip(kappas, rates, strict=True)},
    )
