"""FROC risk scoring and tier thresholds (seed 000 §3.4, Theorem 3, Corollary 3.1).

R(e) = w_c * P(contaminated | e) + w_i * I(e) + w_p * |C({e})| / |V|

Weights and tier thresholds come from ``configs/adapters.yaml``. A config whose thresholds are not
strictly increasing (Corollary 3.1) is refused at load with a :class:`ConfigError` naming the key,
because equal thresholds silently make a tier unreachable. Scores are rounded to 12 decimals before
they are compared with thresholds, so 0.4 + 0.3 * 2/8 lands in the same tier on every machine.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rvu_pipelines.config import load_yaml_config
from rvu_pipelines.paths import config_dir
from rvu_pipelines.provenance.closure import ProvenanceGraph
from rvu_pipelines.provenance.intsets import unique_ints
from rvu_pipelines.provenance.propagation import closure_sizes

SCORE_DECIMALS = 12


class Tier(enum.IntEnum):
    """The five graduated responses, in escalating order."""

    NONE = 0
    FLAG = 1
    QUARANTINE = 2
    PURGE = 3
    EVICT = 4

    @property
    def label(self) -> str:
        return self.name.lower()


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FrocWeights(_Section):
    contamination: float = Field(0.4, ge=0.0, le=1.0, description="w_c")
    influence: float = Field(0.3, ge=0.0, le=1.0, description="w_i")
    propagation: float = Field(0.3, ge=0.0, le=1.0, description="w_p")

    @model_validator(mode="after")
    def _bounded(self) -> FrocWeights:
        total = self.contamination + self.influence + self.propagation
        if total <= 0.0 or total > 1.0 + 1e-9:
            raise ValueError(
                f"froc.weights must sum to a value in (0, 1] so R(e) stays in [0, 1]; they sum to {total:g}"
            )
        return self


class TierThresholds(_Section):
    flag: float = Field(0.3, gt=0.0, le=1.0)
    quarantine: float = Field(0.6, gt=0.0, le=1.0)
    purge: float = Field(0.8, gt=0.0, le=1.0)
    evict: float = Field(0.9, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _corollary_3_1(self) -> TierThresholds:
        ordered = [("flag", self.flag), ("quarantine", self.quarantine), ("purge", self.purge), ("evict", self.evict)]
        for (low_name, low), (high_name, high) in zip(ordered, ordered[1:], strict=False):
            if not high > low:
                raise ValueError(
                    f"froc.thresholds.{high_name} ({high:g}) must be greater than "
                    f"froc.thresholds.{low_name} ({low:g}): "
                    "Corollary 3.1 requires flag < quarantine < purge < evict"
                )
        return self

    def as_array(self) -> np.ndarray:
        return np.array([self.flag, self.quarantine, self.purge, self.evict], dtype=np.float64)


class FrocSection(_Section):
    weights: FrocWeights = FrocWeights()
    thresholds: TierThresholds = TierThresholds()
    propagation_depth: int = Field(3, ge=0, le=10)


class ClosureSection(_Section):
    max_depth: int = Field(10, ge=0, le=64)


class DetectionSection(_Section):
    seed_threshold: float = Field(0.5, gt=0.0, le=1.0)


class FrocPolicy(BaseModel):
    """The recovery policy in ``configs/adapters.yaml``: FROC weights and tiers, closure depth, seed threshold."""

    model_config = ConfigDict(extra="allow", frozen=True)

    froc: FrocSection = FrocSection()
    closure: ClosureSection = ClosureSection()
    detection: DetectionSection = DetectionSection()

    @classmethod
    def load(cls, path: Path | str | None = None) -> FrocPolicy:
        """Read and validate the policy; any problem is a ConfigError naming the key."""
        return load_yaml_config(Path(path) if path else config_dir() / "adapters.yaml", cls)

    def tiers_for(self, scores: np.ndarray) -> np.ndarray:
        """The tier (as ``Tier`` ints) of each score: the highest threshold it reaches."""
        scores = np.round(np.asarray(scores, dtype=np.float64), SCORE_DECIMALS)
        return np.searchsorted(self.froc.thresholds.as_array(), scores, side="right").astype(np.int8)

    def tier_for(self, score: float) -> Tier:
        return Tier(int(self.tiers_for(np.array([score]))[0]))

    def summary(self) -> dict[str, Any]:
        """The policy values a certificate records (floats, canonical-JSON friendly)."""
        weights, thresholds = self.froc.weights, self.froc.thresholds
        return {
            "weights": {
                "contamination": weights.contamination,
                "influence": weights.influence,
                "propagation": weights.propagation,
            },
            "thresholds": {
                "flag": thresholds.flag,
                "quarantine": thresholds.quarantine,
                "purge": thresholds.purge,
                "evict": thresholds.evict,
            },
            "propagation_depth": self.froc.propagation_depth,
            "closure_max_depth": self.closure.max_depth,
            "seed_threshold": self.detection.seed_threshold,
        }


@runtime_checkable
class InfluenceSource(Protocol):
    """Where I(e) comes from: one influence value in [0, 1] per adapter (indexed by adapter seq).

    The default reads the ``influence`` an incident log recorded for each adapter; the influence
    estimation issue plugs a gradient-free estimator in here without touching the pipeline.
    """

    name: str

    def adapter_influence(self, store: Any) -> np.ndarray: ...


class RecordedInfluence:
    """I(adapter) as recorded in the incident log's ``adapter_loaded`` lines (0 where absent)."""

    name = "incident_log"

    def adapter_influence(self, store: Any) -> np.ndarray:
        return np.asarray(store.adapter_influence(), dtype=np.float64)


@dataclass(frozen=True)
class RiskTable:
    """FROC components, score and tier for each scored entry (``seqs`` sorted)."""

    seqs: np.ndarray
    contamination: np.ndarray
    influence: np.ndarray
    closure_size: np.ndarray
    total_entries: int
    score: np.ndarray
    tier: np.ndarray

    @property
    def propagation(self) -> np.ndarray:
        return np.minimum(1.0, self.closure_size / max(self.total_entries, 1))

    def counts(self) -> dict[str, int]:
        observed = np.bincount(self.tier.astype(np.int64), minlength=len(Tier))
        return {tier.label: int(observed[tier]) for tier in Tier}

    def seqs_in(self, *tiers: Tier) -> np.ndarray:
        return self.seqs[np.isin(self.tier, [int(t) for t in tiers])]

    def score_of(self, seqs: np.ndarray | Sequence[int]) -> np.ndarray:
        positions = np.searchsorted(self.seqs, np.asarray(seqs, dtype=np.int64))
        return self.score[positions]


def compute_risk(
    graph: ProvenanceGraph,
    targets: np.ndarray | Sequence[int],
    contamination: np.ndarray,
    adapter_influence: np.ndarray,
    policy: FrocPolicy,
) -> RiskTable:
    """R(e) and its tier for each target entry. ``contamination`` is P per entry, indexed by seq."""
    targets = unique_ints(targets)
    weights = policy.froc.weights
    p = np.clip(np.asarray(contamination, dtype=np.float64)[targets], 0.0, 1.0)
    adapters = graph.adapter[targets]
    influence = np.zeros(targets.size, dtype=np.float64)
    linked = adapters >= 0
    if np.asarray(adapter_influence).size:
        influence[linked] = np.clip(np.asarray(adapter_influence, dtype=np.float64)[adapters[linked]], 0.0, 1.0)
    sizes = closure_sizes(graph, targets, policy.froc.propagation_depth)
    total = graph.n
    propagation = np.minimum(1.0, sizes / max(total, 1))
    score = weights.contamination * p + weights.influence * influence + weights.propagation * propagation
    score = np.round(score, SCORE_DECIMALS)
    return RiskTable(targets, p, influence, sizes, total, score, policy.tiers_for(score))
