"""Composite defenses: several write detectors combined into one (seed 003, §5 and Appendix C).

What the seed calls composite. In the attack-defense matrix it is a weighted vote of its watermark,
validation and proactive defenses: reject c if Σ_j w_j d_j(c) > θ with (w_wm, w_val, w_pro) =
(0.50, 0.20, 0.30), θ = 0.50, d_j ∈ {0, 1} each member's decision. In the multi-agent SIR study the
composite is "approximated by" MEMSAD at a looser κ = 1.0 (MEMSAD alone runs at κ = 2.0). This platform
has none of the watermark / validation / proactive members (a watermark needs control of the ingestion
pipeline), so:

- ``CompositeDetector(members)`` without weights is the OR of its members at their own calibrated
  thresholds: score = max_j (s_j − τ_j) / σ̂_j (each member's margin in its own benign σ̂ units),
  threshold 0, so it flags exactly when any member flags.
- ``CompositeDetector(members, weights=..., theta=...)`` is the seed's weighted vote, with each hard
  decision d_j replaced by Φ((s_j − τ_j)/σ̂_j) (≈ d_j when a member is decisive, ½ at its threshold), so
  the score is continuous for ROC curves; it flags when the soft vote exceeds θ.
- ``composite_defense(kappa)`` is the composite the study uses: the OR of MEMSAD and the seed's best
  baseline (Energy, the best AUROC of the seed's baselines on AP and IM), both at the same κ,
  default 1.0 as in the SIR study. Pass ``baseline=`` to OR MEMSAD with another detector.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.defense_catalog import write_defense
from rvu_pipelines.memory_poisoning.defenses.base import WriteContext, WriteDetector
from rvu_pipelines.memory_poisoning.defenses.baselines import EnergyDetector
from rvu_pipelines.memory_poisoning.defenses.memsad import MemsadDetector, check_kappa

COMPOSITE_KAPPA = 1.0  # the SIR study's composite; MEMSAD alone uses 2.0


def _member_scale(member: WriteDetector) -> float:
    """A member's benign σ̂ (from its calibration) so margins are comparable; 1.0 if it has none."""
    calibration: Any = getattr(member, "calibration", None)
    sigma = getattr(calibration, "sigma", None)
    return float(sigma) if sigma is not None and sigma > 0 else 1.0


class CompositeDetector:
    """OR (no weights) or the seed's weighted vote (weights + theta) of calibrated write detectors."""

    def __init__(
        self,
        members: Sequence[WriteDetector],
        *,
        weights: Sequence[float] | None = None,
        theta: float = 0.5,
        name: str = "composite",
    ) -> None:
        if not members:
            raise MemoryPoisoningInputError("a composite defense needs at least one member detector")
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise MemoryPoisoningInputError(f"composite members need distinct names, got {names}")
        if weights is not None:
            if len(weights) != len(members) or any(not w >= 0 for w in weights) or not sum(weights) > 0:
                raise MemoryPoisoningInputError(
                    f"weights must be {len(members)} non-negative numbers with a positive sum, got {list(weights)}"
                )
            if not 0 < theta < sum(weights):
                raise MemoryPoisoningInputError(f"theta must be in (0, sum of weights = {sum(weights)}), got {theta}")
        self.members = list(members)
        self.weights = None if weights is None else [float(w) for w in weights]
        self.theta = float(theta)
        self.name = name
        self._fitted = False

    @property
    def threshold(self) -> float:
        if not self._fitted:
            raise MemoryPoisoningInputError(f"{self.name}: call fit(context) before scoring or reading the threshold")
        return 0.0 if self.weights is None else self.theta

    def fit(self, context: WriteContext) -> CompositeDetector:
        for member in self.members:
            member.fit(context)
        self._scales = [_member_scale(m) for m in self.members]
        self._fitted = True
        return self

    def margins(self, vectors: np.ndarray, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Each member's (score − threshold) / σ̂: positive where that member flags."""
        self.threshold  # noqa: B018 - raises when not fitted
        return {
            m.name: (np.asarray(m.score(vectors, texts), dtype=np.float64) - m.threshold) / scale
            for m, scale in zip(self.members, self._scales, strict=True)
        }

    def score(self, vectors: np.ndarray, texts: Sequence[str] = ()) -> np.ndarray:
        margins = np.vstack(list(self.margins(vectors, texts).values()))
        if self.weights is None:
            return margins.max(axis=0)
        from scipy.stats import norm

        return np.asarray(self.weights) @ norm.cdf(margins)

    def flags(self, vectors: np.ndarray, texts: Sequence[str] = ()) -> np.ndarray:
        if self.weights is None:  # exactly "any member flags", computed from the members' own rules
            return np.any(np.vstack([m.flags(vectors, texts) for m in self.members]), axis=0)
        return self.score(vectors, texts) > self.theta


def composite_defense(
    kappa: float = COMPOSITE_KAPPA, *, baseline: WriteDetector | None = None, name: str | None = None
) -> CompositeDetector:
    """OR(MEMSAD(κ), Energy(κ)) by default: the study's composite (SIR: κ = 1.0)."""
    kappa = check_kappa(kappa)
    member = baseline if baseline is not None else EnergyDetector(kappa)
    label = name or f"composite(k={kappa:g})"
    return CompositeDetector([MemsadDetector(kappa), member], name=label)


@write_defense("composite", in_paper=True)
def composite_write_defense(kappa: float, composite_kappa: float) -> CompositeDetector:
    return composite_defense(composite_kappa, name="composite")
