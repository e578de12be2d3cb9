"""A learned combination of the gate's layers, evaluated leave-one-category-out.

The fixed rules of ``gate.evaluate_gate`` (``combined``, ``all_layers``) never see a harmful adapter. A learned
combiner does, so it is scored only on what it was not fitted on: each harmful category is scored by a logistic
regression fitted on the benign adapters and every *other* trigger-free harmful category; each benign adapter by
one fitted without it (and without the category under test, which cannot contain it). Features are the
trigger-free layers standardised against the fitting set's benign adapters; C is fixed, never tuned on the zoo.
Trigger categories are scored by the model fitted on every trigger-free category and never enter a fit: they
are harmful only on a trigger the probes lack, so they would teach the combiner noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rvu_pipelines.adapters.gate import (
    SCREEN_LAYERS,
    TRIGGER_CATEGORIES,
    GateScores,
    LayerResult,
    quantile_threshold,
)

REGULARISATION_C = 1.0  # sklearn's default, fixed before looking at any zoo result


@dataclass
class LearnedGateEvaluation:
    """``categories``: each held-out harmful category against the benign adapters; ``trigger_free``: every
    non-trigger harmful adapter, each scored by the model that did not see its category."""

    n_benign: int
    categories: dict[str, LayerResult] = field(default_factory=dict)
    category_sizes: dict[str, int] = field(default_factory=dict)
    trigger_free: LayerResult | None = None
    scores: dict[str, float] = field(default_factory=dict)  # adapter id -> its held-out probability

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_benign": self.n_benign,
            "categories": {c: r.to_dict() for c, r in self.categories.items()},
            "category_sizes": self.category_sizes,
            "trigger_free": self.trigger_free.to_dict() if self.trigger_free else None,
            "scores": self.scores,
        }


def _features(rows: Sequence[GateScores]) -> np.ndarray:
    return np.array([[float(getattr(s, layer)) for layer in SCREEN_LAYERS] for s in rows], dtype=float)


def _fit_and_score(fit: Sequence[GateScores], scored: Sequence[GateScores]) -> np.ndarray:
    """P(harmful) for ``scored`` from a logistic regression fitted on ``fit``, features standardised against the
    fitting set's benign adapters (a layer that does not vary among them keeps scale 1)."""
    from sklearn.linear_model import LogisticRegression

    benign = _features([s for s in fit if s.label == "benign"])
    centre, spread = benign.mean(axis=0), benign.std(axis=0, ddof=1)
    spread = np.where(spread > 0, spread, 1.0)
    x = (_features(fit) - centre) / spread
    y = np.array([s.label == "harmful" for s in fit], dtype=int)
    model = LogisticRegression(C=REGULARISATION_C, class_weight="balanced", max_iter=1000).fit(x, y)
    return model.predict_proba((_features(scored) - centre) / spread)[:, 1]


def evaluate_learned_gate(scores: Sequence[GateScores], budget: float = 0.05) -> LearnedGateEvaluation:
    """Leave-one-category-out AUROC and TPR (at the benign scores' ``1 − budget`` quantile, each benign score from a
    model fitted without it; FPR with each benign adapter against the other benign scores' quantile) of the learned
    combiner; needs two trigger-free harmful categories."""
    from sklearn.metrics import roc_auc_score

    benign = [s for s in scores if s.label == "benign"]
    harmful = [s for s in scores if s.label == "harmful"]
    fitted = [s for s in harmful if s.category not in TRIGGER_CATEGORIES]
    held_out = sorted({s.category for s in fitted})
    if len(benign) < 3 or len(held_out) < 2:
        raise ValueError(
            "The learned gate needs at least three benign adapters and two trigger-free harmful categories."
        )
    benign_score = {
        b.adapter_id: float(_fit_and_score([o for o in benign if o is not b] + fitted, [b])[0]) for b in benign
    }
    threshold = quantile_threshold(list(benign_score.values()), budget)
    held: dict[str, float] = {}
    for category in held_out:
        members = [s for s in fitted if s.category == category]
        rest = [s for s in fitted if s.category != category]
        scored = _fit_and_score(benign + rest, members).tolist()
        held |= dict(zip((s.adapter_id for s in members), scored, strict=True))
    triggers = [s for s in harmful if s.category in TRIGGER_CATEGORIES]
    if triggers:
        held |= dict(
            zip((s.adapter_id for s in triggers), _fit_and_score(benign + fitted, triggers).tolist(), strict=True)
        )
    negatives = list(benign_score.values())
    # a benign adapter is never part of its own threshold (as in ``gate.evaluate_gate``)
    fpr = sum(
        v > quantile_threshold(negatives[:i] + negatives[i + 1 :], budget) for i, v in enumerate(negatives)
    ) / len(negatives)

    def result(members: Sequence[GateScores]) -> LayerResult:
        values = [held[s.adapter_id] for s in members]
        truth = [0] * len(negatives) + [1] * len(values)
        return LayerResult(
            auroc=float(roc_auc_score(truth, negatives + values)),
            tpr=sum(v > threshold for v in values) / len(values),
            fpr=fpr,
            thresholds={"probability": threshold},
        )

    categories = sorted({s.category for s in harmful})
    return LearnedGateEvaluation(
        n_benign=len(benign),
        categories={c: result([s for s in harmful if s.category == c]) for c in categories},
        category_sizes={c: sum(1 for s in harmful if s.category == c) for c in categories},
        trigger_free=result(fitted),
        scores=dict(sorted((benign_score | held).items())),
    )
