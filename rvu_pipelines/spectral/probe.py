"""A regularised logistic probe over per-example feature vectors (e.g. per-head spectral statistics and
Attention Tracker's per-head focus), and its leave-one-dataset-out evaluation.

The probe is scikit-learn's L2 ``LogisticRegression`` on standardised features; C is chosen by grouped
cross-validation (``GroupKFold``: both members of a pair always fall in the same fold, so a pair never
leaks between training and validation) on the training examples only, scored by AUROC.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rvu_pipelines.spectral.errors import CalibrationError, SpectralInputError
from rvu_pipelines.spectral.paired import in_whole_pairs, paired_bootstrap_auroc
from rvu_pipelines.spectral.uncertainty import BOOTSTRAP_RESAMPLES, Estimate

C_GRID: tuple[float, ...] = tuple(float(c) for c in np.logspace(-3, 2, 11))
N_FOLDS = 5
MAX_ITER = 2000


def _check(features: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.asarray(features, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise SpectralInputError(f"Features must be (examples × features); got shape {x.shape}.")
    y = np.asarray(labels).reshape(-1).astype(np.int64)
    g = np.asarray(groups).reshape(-1)
    if not x.shape[0] == y.size == g.size:
        raise SpectralInputError(f"features ({x.shape[0]}), labels ({y.size}) and groups ({g.size}) differ in length.")
    if not np.isfinite(x).all():
        bad = np.flatnonzero(~np.isfinite(x).all(axis=0))
        raise SpectralInputError(f"Features hold non-finite values (columns {bad[:10].tolist()}).")
    if set(np.unique(y).tolist()) != {0, 1}:
        raise CalibrationError("The probe needs both classes (0 and 1) among its training examples.")
    return x, y, g


@dataclass(frozen=True)
class LogisticProbe:
    """A fitted standardise → L2 logistic pipeline, the C chosen and its cross-validated AUROC."""

    pipeline: Any
    C: float
    cv_auroc: float
    n_train: int

    def score(self, features: np.ndarray) -> np.ndarray:
        """Decision values (log-odds of injected); higher = more likely injected."""
        x = np.asarray(features, dtype=np.float64)
        return np.asarray(self.pipeline.decision_function(x[:, None] if x.ndim == 1 else x), dtype=np.float64)


def fit_probe(
    features: np.ndarray,
    labels: np.ndarray,
    groups: np.ndarray,
    *,
    c_grid: tuple[float, ...] = C_GRID,
    n_folds: int = N_FOLDS,
) -> LogisticProbe:
    """Fit on the examples given (calibration data only), C chosen by ``GroupKFold`` AUROC."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y, g = _check(features, labels, groups)
    folds = min(n_folds, len(np.unique(g)))
    if folds < 2:
        raise CalibrationError(f"Choosing C needs ≥ 2 groups to cross-validate over, got {folds}.")
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=MAX_ITER))
    search = GridSearchCV(
        pipeline,
        {"logisticregression__C": list(c_grid)},
        scoring="roc_auc",
        cv=GroupKFold(n_splits=folds),
        error_score=np.nan,
        refit=True,
    )
    search.fit(x, y, groups=g)
    return LogisticProbe(
        pipeline=search.best_estimator_,
        C=float(search.best_params_["logisticregression__C"]),
        cv_auroc=float(search.best_score_),
        n_train=int(y.size),
    )


@dataclass(frozen=True)
class LodoResult:
    """One held-out source: its AUROC (group-bootstrap interval), the probe's C and training size."""

    source: str
    auroc: Estimate
    paired: bool
    C: float
    cv_auroc: float
    n_train: int

    def as_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            **{f"auroc_{k}": v for k, v in self.auroc.as_dict().items()},
            "paired": self.paired,
            "C": self.C,
            "cv_auroc": self.cv_auroc,
            "n_train": self.n_train,
        }


def leave_one_dataset_out(
    features: np.ndarray,
    labels: np.ndarray,
    sources: np.ndarray,
    groups: np.ndarray,
    splits: np.ndarray | None = None,
    *,
    c_grid: tuple[float, ...] = C_GRID,
    n_boot: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> list[LodoResult]:
    """Per source: fit on every other source, score the held-out source. With ``splits`` the probe trains
    on the other sources' ``calibration`` examples and is scored on the held-out source's ``heldout``
    examples; without, on all of them. The interval resamples groups (pairs stay whole; it is the paired
    bootstrap when every held-out group is one clean + one injected example)."""
    x, y, g = _check(features, labels, groups)
    src = np.asarray(sources).reshape(-1).astype(str)
    if src.size != y.size:
        raise SpectralInputError(f"sources ({src.size}) and labels ({y.size}) differ in length.")
    split = None if splits is None else np.asarray(splits).reshape(-1).astype(str)
    if split is not None and split.size != y.size:
        raise SpectralInputError(f"splits ({split.size}) and labels ({y.size}) differ in length.")
    names = list(dict.fromkeys(src.tolist()))
    if len(names) < 2:
        raise CalibrationError("Leave-one-dataset-out needs ≥ 2 sources.")
    results = []
    for name in names:
        train = src != name
        test = src == name
        if split is not None:
            train &= split == "calibration"
            test &= split == "heldout"
        if len(set(y[test].tolist())) < 2:
            raise CalibrationError(f"The held-out examples of {name!r} do not hold both classes.")
        probe = fit_probe(x[train], y[train], g[train], c_grid=c_grid)
        estimate = paired_bootstrap_auroc(probe.score(x[test]), y[test], g[test], n_boot=n_boot, seed=seed)
        results.append(
            LodoResult(
                name, estimate, bool(in_whole_pairs(y[test], g[test]).all()), probe.C, probe.cv_auroc, probe.n_train
            )
        )
    return results
