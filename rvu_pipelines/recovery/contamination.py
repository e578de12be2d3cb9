"""Which entries an incident contaminated: the seeds (stored P reaches the policy's threshold) and their
v1 / v2 closures. Both the pipeline and the certificate builder read these results, so they live apart
from either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rvu_pipelines.provenance.closure import ClosureResult, ProvenanceGraph, closure_v1, closure_v2
from rvu_pipelines.provenance.incident import IncidentLog
from rvu_pipelines.provenance.intsets import unique_ints
from rvu_pipelines.provenance.store import ProvenanceStore
from rvu_pipelines.recovery.froc import FrocPolicy


@dataclass(frozen=True)
class SeedReport:
    """Contamination seeds of one incident: entry seqs and ids, P, and where each came from."""

    seqs: np.ndarray
    entry_ids: list[str]
    scores: dict[str, float]
    sources: dict[str, list[str]]


@dataclass(frozen=True)
class Closures:
    """Both closures, and how many entries each depth bound left out (0: the closure is complete).

    The bound (``policy.closure.max_depth``) keeps a runaway closure finite, but what lies beyond it is
    contamination left untouched, so the count is reported rather than silently dropped.
    """

    v1: ClosureResult
    v2: ClosureResult
    v1_beyond: int = 0
    v2_beyond: int = 0


def find_seeds(
    store: ProvenanceStore, incident: IncidentLog, policy: FrocPolicy, sources: Mapping[str, list[str]] | None = None
) -> SeedReport:
    """Entries of this incident whose stored P(contaminated | e) reaches the seed threshold."""
    seqs = store.incident_seqs(incident)
    p_all = store.contamination_scores()
    chosen = unique_ints(seqs[np.round(p_all[seqs], 12) >= policy.detection.seed_threshold])
    ids = store.entry_ids(chosen)
    return SeedReport(
        seqs=chosen,
        entry_ids=ids,
        scores={entry_id: float(p_all[seq]) for entry_id, seq in zip(ids, chosen.tolist(), strict=True)},
        sources={entry_id: list((sources or {}).get(entry_id) or ["store"]) for entry_id in ids},
    )


def entries_beyond_depth(graph: ProvenanceGraph, bounded: ClosureResult) -> int:
    """How many entries the unbounded closure adds to ``bounded`` (0 when the bound cut nothing off).

    Only a closure that reached its bound can be cut off, so the unbounded search runs only then.
    """
    if not bounded.depths.size or int(bounded.depths.max()) < bounded.max_depth:
        return 0
    unbounded = (closure_v2 if bounded.adapter_aware else closure_v1)(graph, bounded.seeds, max(graph.n, 1))
    return unbounded.size - bounded.size


def compute_closures(graph: ProvenanceGraph, seeds: np.ndarray, policy: FrocPolicy) -> Closures:
    """v1 (parent/child) and v2 (adapter-aware, Theorem 2c) closures at the policy's depth bound."""
    depth = policy.closure.max_depth
    v1, v2 = closure_v1(graph, seeds, depth), closure_v2(graph, seeds, depth)
    return Closures(v1=v1, v2=v2, v1_beyond=entries_beyond_depth(graph, v1), v2_beyond=entries_beyond_depth(graph, v2))
