"""The body of a recovery certificate, assembled from the store's state after the tiers ran.

Read through the :class:`~rvu_pipelines.provenance.store.ProvenanceStore` interface (no SQL here); the
format, signing and verification are in :mod:`certificate`. Version 3 states every closure entry's
resulting state, not only this run's actions (see :mod:`certificate`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rvu_pipelines import __version__
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.provenance.intsets import union_ints
from rvu_pipelines.recovery.certificate import CERTIFICATE_VERSION
from rvu_pipelines.recovery.froc import Tier

if TYPE_CHECKING:
    from rvu_pipelines.provenance.incident import IncidentLog
    from rvu_pipelines.provenance.store import ProvenanceStore
    from rvu_pipelines.recovery.contamination import Closures, SeedReport
    from rvu_pipelines.recovery.froc import FrocPolicy, RiskTable
    from rvu_pipelines.recovery.tiers import TierPlan
    from rvu_pipelines.recovery.vector_index import VectorIndex

ENTRY_STATES = ("active", "flagged", "restored", "quarantined", "purged")
KEPT_RESTORED = "kept restored by operator decision"


def _fmt(value: float) -> float:
    return round(float(value), 6)


def entry_state(tainted: bool, quarantined: bool, purged: bool, restored: bool) -> str:
    """One entry's state, the most severe that holds: purged > quarantined > restored > flagged > active."""
    if purged:
        return "purged"
    if quarantined:
        return "quarantined"
    if restored:
        return "restored"
    return "flagged" if tainted else "active"


def resulting_state(
    store: ProvenanceStore, seqs: np.ndarray, entry_ids: Sequence[str], restored: Iterable[int]
) -> dict[str, Any]:
    """Each entry's state read back from the store (not from the plan), plus a count per state."""
    lifted = {int(seq) for seq in restored}
    states = store.entry_states(seqs)
    entries = {
        entry_id: entry_state(bool(t), bool(q), bool(p), int(seq) in lifted)
        for entry_id, seq, t, q, p in zip(
            entry_ids, seqs.tolist(), states["tainted"], states["quarantined"], states["purged"], strict=True
        )
    }
    counts = dict.fromkeys(ENTRY_STATES, 0)
    for state in entries.values():
        counts[state] += 1
    return {"entries": dict(sorted(entries.items())), "counts": counts}


def build_certificate_body(
    store: ProvenanceStore,
    index: VectorIndex | None,
    incident: IncidentLog,
    policy: FrocPolicy,
    detector: Mapping[str, str],
    seeds: SeedReport,
    closures: Closures,
    risk: RiskTable,
    plan: TierPlan,
    probe: Mapping[str, Any],
    gate: Mapping[str, Any],
    *,
    restored: Iterable[int] = (),
    kept_restored: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The unsigned certificate: a pure function of the incident, the store's state and the policy.

    ``detector`` is the certificate's detector section, ``{"name": ..., "version": ...}``.
    ``runtime_recovery.flagged`` / ``quarantined`` / ``purged`` are this run's *actions* (the tier plan,
    less what ``kept_restored`` kept: entry id -> the operator's recorded reason); ``resulting_state``
    is what the store holds for each closure entry after the tiers (``restored``: entry seqs whose
    quarantine an operator lifted), so an earlier run's purge or quarantine is never hidden.
    """
    graph_ids = store.entry_ids
    closure_ids = graph_ids(closures.v2.members)
    closure_v1_ids = graph_ids(closures.v1.members)
    tier_of = {int(seq): Tier(int(tier)) for seq, tier in zip(risk.seqs.tolist(), risk.tier.tolist(), strict=True)}
    id_of = dict(zip(closures.v2.members.tolist(), closure_ids, strict=True))
    states = store.entry_states(closures.v2.members)
    state_lines = sorted(
        f"{id_of[int(seq)]}\t{int(t)}\t{int(q)}\t{int(p)}"
        for seq, t, q, p in zip(
            closures.v2.members.tolist(), states["tainted"], states["quarantined"], states["purged"], strict=True
        )
    )
    isolated = union_ints(plan.quarantine, plan.purge)
    retrievable = int(index.contains(isolated).sum()) if index is not None and isolated.size else 0
    manifest = [
        {
            "entry_id": row.entry_id,
            "content_hash": row.content_hash,
            "action_type": row.action_type,
            "active_adapter_id": row.active_adapter_id,
            "tier": tier_of[row.seq].label,
        }
        for row in sorted(store.manifest(closures.v2.members), key=lambda row: row.entry_id)
    ]
    risk_entries = {
        entry_id: {
            "score": _fmt(score),
            "tier": Tier(int(tier)).label,
            "contamination": _fmt(p),
            "influence": _fmt(i),
            "closure_size": int(size),
        }
        for entry_id, score, tier, p, i, size in zip(
            graph_ids(risk.seqs),
            risk.score.tolist(),
            risk.tier.tolist(),
            risk.contamination.tolist(),
            risk.influence.tolist(),
            risk.closure_size.tolist(),
            strict=True,
        )
    }
    # adapters: the ones this incident loaded or used, plus every adapter the closure tainted
    incident_adapter_ids = {r.adapter_id for r in incident.records if r.adapter_id} | {
        r.active_adapter_id for r in incident.records if r.active_adapter_id
    }
    tainted_set = set(closures.v2.tainted_adapters.tolist())
    evict_set = set(plan.evict_adapters.tolist())
    adapters = []
    for row in store.adapters():
        if row.adapter_id not in incident_adapter_ids and row.seq not in tainted_set:
            continue
        evicted = row.seq in evict_set or row.purged
        adapters.append(
            {
                "adapter_id": row.adapter_id,
                "adapter_name": row.adapter_name,
                "adapter_hash": row.adapter_hash,
                "source": row.source,
                "fused": row.fused,
                "tainted": row.seq in tainted_set or row.tainted,
                "status": "evicted" if evicted else "retained",
                "influence": _fmt(row.influence or 0.0),
            }
        )
    adapters.sort(key=lambda item: str(item["adapter_id"]))
    fusion_warnings = [
        {
            "adapter_id": a["adapter_id"],
            "warning": "adapter was fused into the base weights; unloading cannot remove its contribution",
        }
        for a in adapters
        if a["fused"] and (a["tainted"] or a["status"] == "evicted")
    ]
    kept = dict(kept_restored or {})
    flagged_ids = sorted(graph_ids(plan.flag))
    quarantined_ids = sorted(graph_ids(plan.quarantine))
    purged_ids = sorted(graph_ids(plan.purge))
    return {
        "version": CERTIFICATE_VERSION,
        "certificate_type": "rvu-recovery",
        "generated_by": {"software": "rvu-pipelines", "version": __version__},
        "incident": {
            "incident_id": incident.incident_id,
            "sha256": incident.sha256,
            "records": len(incident.records),
            "episodes": incident.episodes,
            "last_timestamp": _fmt(incident.last_timestamp),
        },
        "policy": policy.summary(),
        "detector": {"name": detector["name"], "version": detector["version"]},
        "runtime_recovery": {
            "seed_ids": sorted(seeds.entry_ids),
            "seeds": [
                {"entry_id": e, "score": _fmt(seeds.scores[e]), "sources": sorted(seeds.sources[e])}
                for e in sorted(seeds.entry_ids)
            ],
            "closure_ids": sorted(closure_ids),
            "closure_v1_ids": sorted(closure_v1_ids),
            "closure_size": len(closure_ids),
            "closure_v1_size": len(closure_v1_ids),
            "adapter_expansion_gain": len(closure_ids) - len(closure_v1_ids),
            "flagged": flagged_ids,
            "quarantined": quarantined_ids,
            "purged": purged_ids,
            "total_flagged": len(flagged_ids),
            "total_quarantined": len(quarantined_ids),
            "total_purged": len(purged_ids),
            "manifest_entries": manifest,
            "tier_counts": risk.counts(),
            "state_digest": "sha256:" + sha256_bytes("\n".join(state_lines).encode()),
            "index": {"isolated_vectors_retrievable": retrievable},
            "resulting_state": resulting_state(store, closures.v2.members, closure_ids, restored),
            "kept_restored": [
                {"entry_id": entry_id, "decision": KEPT_RESTORED, "reason": kept[entry_id]} for entry_id in sorted(kept)
            ],
            "truncated_at_depth": closures.v2.max_depth if closures.v2_beyond else None,
            "entries_beyond_depth": closures.v2_beyond,
        },
        "adapter_attestation": {
            "adapters": adapters,
            "tainted": sorted(store.adapter_ids(closures.v2.tainted_adapters)),
            "evicted": sorted(a["adapter_id"] for a in adapters if a["status"] == "evicted"),
            "retained": sorted(a["adapter_id"] for a in adapters if a["status"] == "retained"),
            "fusion_warnings": fusion_warnings,
            "gate": dict(gate),
        },
        "risk_scores": {"entries": risk_entries, "total_entries": risk.total_entries},
        "membership_probe": dict(probe),
    }
