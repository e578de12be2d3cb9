"""FROC risk scoring and tier thresholds (seed 000 §3.4, Theorem 3, Corollary 3.1).

R(e) = w_c * P(contaminated | e) + w_i * I(e) + w_p * min(1, |C({e})| / |V|)

Weights and tier thresholds come from ``configs/adapters.yaml``. A config whose thresholds are not
strictly increasing (Corollary 3.1) is refused at load with a :class:`ConfigError` naming the key,
because equal thresholds silently make a tier unreachable. Scores are rounded to 12 decimals before
they are compared with thresholds, so 0.4 + 0.3 * 2/8 lands in the same tier on every machine.

The population |V| (``froc.spread_population``)
-----------------------------------------------
``store`` is the paper's |V|: every entry in the store. It dilutes: unrelated entries (other incidents,
other episodes, a flood of harmless log lines) grow |V| but not |C({e})|, so on a large store the
spread term tends to 0, the highest reachable score is w_c + w_i = 0.7, and PURGE (0.8) and EVICT
(0.9) become unreachable without anyone being told. Anyone who can write logs can lower every score.
E3 (Table 3) pins ``store``, since the paper's numbers are computed with it.

``incident`` (the default) is the population the incident could have contaminated: the entries within
``propagation_depth`` of the scored entries (the v2 closure), i.e. the union of their C({e}). Why this
one: it keeps the paper's meaning of the term (the share of the reachable memory that e's contamination
spreads to) and its numbers whenever the store holds just the incident (the shipped example scores the
same), yet it depends only on the incident's connected neighbourhood. An entry that is neither in the
closure nor within ``propagation_depth`` of it lies on no path of length <= depth from a scored entry,
so it changes no C({e}) and not the population: R, and so every tier, of the incident is invariant
under any amount of unrelated data. Entries written under an adapter of the closure, or as children of
its entries, are not unrelated: the v2 closure takes them in (Theorem 2c) and they are scored too.
What it does not fix: the term is still a share, so one huge connected incident has small shares;
:func:`unreachable_tiers` reports that per risk table instead of letting it pass silently.

Why R stays in [0, 1] under either population: P and I are clipped to [0, 1]; the spread term is
min(1, .) >= 0 (and with ``incident`` C({e}) is a subset of the population, so the share is <= 1 before
the min); the weights are >= 0 and sum to at most 1 (checked at load), so R is at most their sum.
Why Corollary 3.1 still holds: the tier is the number of thresholds <= R, and the thresholds are
strictly increasing (checked at load), so the tier is a non-decreasing function of R whatever the
population; within one risk table the population is shared, so R (and the tier) is also monotone in
|C({e})|, P and I (Theorem 3). ``tests/recovery/test_recovery_froc.py`` checks both with hypothesis.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rvu_pipelines.config import load_yaml_config
from rvu_pipelines.paths import config_dir
from rvu_pipelines.provenance.closure import ProvenanceGraph, closure_v2
from rvu_pipelines.provenance.intsets import unique_ints
from rvu_pipelines.provenance.propagation import closure_sizes

SCORE_DECIMALS = 12

SpreadPopulation = Literal["store", "incident"]
PAPER_POPULATION: SpreadPopulation = "store"
AdapterEvidence = Literal["seed", "influence"]

log = logging.getLogger(__name__)


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
    spread_population: SpreadPopulation = Field(
        "incident", description="|V| of the spread term: 'store' (the paper's, dilutes) or 'incident' (see module doc)"
    )
    adapter_evidence: AdapterEvidence = Field(
        "seed",
        description="P of an entry written under a tainted adapter: 'seed' (the detector's only, as the paper) or "
        "'influence' (at least the adapter's I; see compute_risk)",
    )


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
        policy = load_yaml_config(Path(path) if path else config_dir() / "adapters.yaml", cls)
        for message in tier_warnings(policy):
            log.warning("%s", message)
        return policy

    def with_spread_population(self, population: SpreadPopulation) -> FrocPolicy:
        """The same policy with another |V| (E3 pins the paper's ``store``)."""
        return self._with_froc(spread_population=population)

    def with_adapter_evidence(self, evidence: AdapterEvidence) -> FrocPolicy:
        """The same policy with another rule for entries written under a tainted adapter (see compute_risk)."""
        return self._with_froc(adapter_evidence=evidence)

    def _with_froc(self, **changes: Any) -> FrocPolicy:
        return self.model_copy(update={"froc": self.froc.model_copy(update=changes)})

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
            "spread_population": self.froc.spread_population,
            "adapter_evidence": self.froc.adapter_evidence,
            "closure_max_depth": self.closure.max_depth,
            "seed_threshold": self.detection.seed_threshold,
        }


@runtime_checkable
class InfluenceSource(Protocol):
    """Where I(e) comes from: one influence value in [0, 1] per adapter (indexed by adapter seq).

    The default reads the ``influence`` an incident log recorded for each adapter; another source (a
    gradient-free influence estimator) plugs in here without touching the pipeline.
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
    total_entries: int  # |V|: the size of the spread population below
    score: np.ndarray
    tier: np.ndarray
    population: SpreadPopulation = PAPER_POPULATION
    warnings: tuple[str, ...] = ()  # tiers no entry of this table could reach (see unreachable_tiers)

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


def unreachable_tiers(policy: FrocPolicy, max_spread: float = 1.0) -> list[Tier]:
    """The tiers no score can reach when the spread term is at most ``max_spread``.

    The highest possible R is w_c + w_i + w_p * max_spread (P = I = 1); a tier whose threshold lies
    above it is dead. With ``max_spread = 1`` this is a property of the config alone (e.g. w_p lowered
    to 0.1 leaves EVICT at 0.9 out of reach); with the largest spread of a risk table it says which tiers
    that table's population allows (on a diluted ``store`` population, PURGE and EVICT).
    """
    weights = policy.froc.weights
    spread = min(1.0, max(0.0, float(max_spread)))
    ceiling = round(weights.contamination + weights.influence + weights.propagation * spread, SCORE_DECIMALS)
    bounds = policy.froc.thresholds.as_array().tolist()
    return [tier for tier, bound in zip(list(Tier)[1:], bounds, strict=True) if bound > ceiling]


def tier_warnings(
    policy: FrocPolicy, max_spread: float = 1.0, largest_closure: int | None = None, population: int | None = None
) -> list[str]:
    """One message naming the tiers :func:`unreachable_tiers` finds, and why (empty when all are reachable)."""
    dead = unreachable_tiers(policy, max_spread)
    if not dead:
        return []
    weights = policy.froc.weights
    ceiling = weights.contamination + weights.influence + weights.propagation * min(1.0, max(0.0, max_spread))
    names = ", ".join(tier.label for tier in dead)
    if largest_closure is None:
        cause = f"the weights sum to {ceiling:.4g}"
    else:
        cause = (
            f"the largest spread term is {max_spread:.4g} (|C({{e}})| <= {largest_closure} of |V| = {population}, "
            f"froc.spread_population = {policy.froc.spread_population}), so R <= {ceiling:.4g}"
        )
    return [f"FROC tiers {names} cannot be reached: {cause}, below their thresholds in froc.thresholds"]


def spread_population_size(graph: ProvenanceGraph, targets: np.ndarray, policy: FrocPolicy) -> int:
    """|V| for the spread term of ``targets`` (sorted, distinct): the store, or the incident's neighbourhood.

    ``incident``: the entries within ``propagation_depth`` of any target, which is exactly the union of
    the targets' C({e}) (a BFS from a set reaches what the BFS from each member reaches), so every
    |C({e})| is at most this and unrelated entries never count.
    """
    if policy.froc.spread_population == "store":
        return graph.n
    return closure_v2(graph, targets, policy.froc.propagation_depth).size


def compute_risk(
    graph: ProvenanceGraph,
    targets: np.ndarray | Sequence[int],
    contamination: np.ndarray,
    adapter_influence: np.ndarray,
    policy: FrocPolicy,
    *,
    tainted_adapters: np.ndarray | Sequence[int] = (),
) -> RiskTable:
    """R(e) and its tier for each target entry. ``contamination`` is P per entry, indexed by seq.

    |V| is the policy's spread population (module doc); ``warnings`` names the tiers that no entry of
    this table could reach even with P = I = 1, given its largest spread term.

    ``froc.adapter_evidence: influence`` takes P of an entry written under one of ``tainted_adapters`` (the v2
    closure reached an entry of that adapter from a contamination seed) as at least I(adapter): the detector
    sees nothing wrong in a message the adapter changed (E1 with adapters: P ~ 0 there), and I estimates how
    much the adapter changes what it touches. Under the paper's rule ('seed') such an entry scores at most
    w_i + w_p and, with the default weights, is never quarantined. P stays a non-decreasing function of the
    detector's P and of I, so Theorem 3's monotonicity holds for both rules.
    """
    targets = unique_ints(targets)
    weights = policy.froc.weights
    p = np.clip(np.asarray(contamination, dtype=np.float64)[targets], 0.0, 1.0)
    adapters = graph.adapter[targets]
    influence = np.zeros(targets.size, dtype=np.float64)
    linked = adapters >= 0
    if np.asarray(adapter_influence).size:
        influence[linked] = np.clip(np.asarray(adapter_influence, dtype=np.float64)[adapters[linked]], 0.0, 1.0)
    if policy.froc.adapter_evidence == "influence" and len(tainted_adapters):
        under_tainted = linked & np.isin(adapters, unique_ints(tainted_adapters))
        p = np.where(under_tainted, np.maximum(p, influence), p)
    sizes = closure_sizes(graph, targets, policy.froc.propagation_depth)
    total = spread_population_size(graph, targets, policy)
    propagation = np.minimum(1.0, sizes / max(total, 1))
    score = weights.contamination * p + weights.influence * influence + weights.propagation * propagation
    score = np.round(score, SCORE_DECIMALS)
    warnings: list[str] = []
    if targets.size:
        warnings = tier_warnings(policy, float(propagation.max()), int(sizes.max()), total)
        for message in warnings:  # info: a small incident legitimately cannot reach every tier; callers show it
            log.info("%s", message)
    return RiskTable(
        targets,
        p,
        influence,
        sizes,
        total,
        score,
        policy.tiers_for(score),
        policy.froc.spread_population,
        tuple(warnings),
    )
