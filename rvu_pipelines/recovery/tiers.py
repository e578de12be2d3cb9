"""Tier actions (FLAG / QUARANTINE / PURGE / EVICT) on the provenance store and the FAISS index.

- FLAG marks an entry tainted.
- QUARANTINE removes its vector from the retrieval index, keeps the row, records the quarantine;
  :func:`restore_entry` lifts it (vector re-added, ``restored`` event logged with the operator's reason
  and the entry's contamination score at that moment). That event is an operator decision: a later
  recovery keeps the entry restored unless new evidence arrived (:func:`keep_operator_restores`).
- PURGE marks it purged and removes its vector (irreversible).
- EVICT purges it and evicts its adapter (store marks it purged/unloaded; an ``AdapterRuntime``
  hook unloads it from a live runtime).

Every action only changes what is not already in the target state, so applying the same plan twice
changes nothing and logs nothing. The store is the source of truth; the FAISS ``IndexIDMap`` (ids =
entry seqs) is a cache of "vectors an agent may retrieve". Its invariant, on disk at every instant:
index ids are a subset of what the store allows (not purged, not under an active quarantine).
Removals therefore hit the index *before* the store commits, additions *after*; :meth:`VectorIndex.open`
reconciles the two, so a crash anywhere leaves no purged or quarantined vector retrievable and the
next open restores any vector a crash dropped early.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rvu_pipelines.errors import StoreError
from rvu_pipelines.provenance.closure import ProvenanceGraph
from rvu_pipelines.provenance.intsets import union_ints, unique_ints
from rvu_pipelines.provenance.store import ProvenanceStore
from rvu_pipelines.recovery.froc import RiskTable, Tier
from rvu_pipelines.recovery.vector_index import VectorIndex
from rvu_pipelines.settings import tier_fault_pause

log = logging.getLogger(__name__)

FAULT_PAUSE_ENV = "RVU_FAULT_PAUSE_AFTER_TIER_STEPS"
FAULT_MARKER_ENV = "RVU_FAULT_MARKER"


# ------------------------------------------------------------------------------------ hooks


@runtime_checkable
class AdapterRuntime(Protocol):
    """Unloads an evicted adapter from a live agent runtime (the store records the eviction either way)."""

    def unload(self, adapter_id: str) -> None: ...


class NullAdapterRuntime:
    """No live runtime attached: eviction is recorded in the store only."""

    def unload(self, adapter_id: str) -> None:
        return None


class FaultHook:
    """Test-only crash injection: after the N-th tier step, write a marker and sleep.

    Steps of :func:`apply_tiers`: 1 flag, 2 quarantine, 3 purge, 4 evict (store statements run, not
    committed; the index thread may or may not have saved), 5 index removals saved (still uncommitted),
    6 committed.

    Set ``RVU_FAULT_PAUSE_AFTER_TIER_STEPS=N`` (and optionally ``RVU_FAULT_MARKER=path``); a test then
    SIGKILLs the paused process to simulate a crash at exactly that point, or breaks something else (stops the
    database server) and deletes the marker to let the recovery go on into the fault. Unset, it does nothing.
    """

    def __init__(self, pause_after: int | None = None, marker: str | None = None) -> None:
        self.pause_after = pause_after
        self.marker = marker
        self.steps = 0

    @classmethod
    def configured(cls) -> FaultHook:
        """The pause this process was configured with (none unless a crash test set one)."""
        return cls(*tier_fault_pause())

    def step(self, name: str) -> None:
        self.steps += 1
        if self.pause_after is not None and self.steps == self.pause_after:
            if self.marker:
                # written in place: a crash test's marker, read only to know the pause began
                Path(self.marker).write_text(f"{self.steps} {name}\n")
            while self.marker is None or Path(self.marker).exists():  # wait to be killed, or for the marker to go
                time.sleep(0.1)


# ------------------------------------------------------------------------------------ plan and apply


@dataclass(frozen=True)
class TierPlan:
    """What the tiers ask for, as entry / adapter seqs (sorted)."""

    flag: np.ndarray  # every entry at FLAG or above: mark tainted
    quarantine: np.ndarray  # QUARANTINE tier
    quarantine_risk: np.ndarray
    purge: np.ndarray  # PURGE and EVICT tiers
    evict_adapters: np.ndarray  # adapters of EVICT-tier entries
    tainted_adapters: np.ndarray  # adapters the v2 closure expanded (Theorem 2c)

    @classmethod
    def from_risk(cls, risk: RiskTable, graph: ProvenanceGraph, tainted_adapters: np.ndarray) -> TierPlan:
        quarantine = risk.seqs_in(Tier.QUARANTINE)
        evict_entries = risk.seqs_in(Tier.EVICT)
        adapters = graph.adapter[evict_entries]
        return cls(
            flag=risk.seqs_in(Tier.FLAG, Tier.QUARANTINE, Tier.PURGE, Tier.EVICT),
            quarantine=quarantine,
            quarantine_risk=risk.score_of(quarantine),
            purge=risk.seqs_in(Tier.PURGE, Tier.EVICT),
            evict_adapters=unique_ints(adapters[adapters >= 0]),
            tainted_adapters=unique_ints(tainted_adapters),
        )


@dataclass
class TierOutcome:
    """What actually changed (seqs); empty arrays when a plan was already applied."""

    tainted: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    adapters_tainted: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    quarantined: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    purged: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    evicted: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    unloaded: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    vectors_removed: int = 0

    def counts(self) -> dict[str, int]:
        return {
            "tainted": int(self.tainted.size),
            "adapters_tainted": int(self.adapters_tainted.size),
            "quarantined": int(self.quarantined.size),
            "purged": int(self.purged.size),
            "evicted": int(self.evicted.size),
            "unloaded": int(self.unloaded.size),
            "vectors_removed": int(self.vectors_removed),
        }

    @property
    def changed(self) -> bool:
        return any(self.counts().values())


def apply_tiers(
    store: ProvenanceStore,
    index: VectorIndex | None,
    plan: TierPlan,
    *,
    details: Mapping[str, Any] | None = None,
    runtime: AdapterRuntime | None = None,
    fault: FaultHook | None = None,
) -> TierOutcome:
    """Apply a tier plan: index removals saved first, then every store change in one transaction.

    The index work (remove + atomic save) runs in a thread while the store statements execute, and
    the store commits only after it finished: so the index never holds a vector the committed store
    forbids. A crash before the commit leaves the store as it was (the index may lack vectors the
    store still allows; the next :meth:`VectorIndex.open` puts them back); a crash after it leaves
    the plan fully applied. Either way re-running finishes the job.
    """
    details = dict(details or {})
    fault = fault or FaultHook()
    outcome = TierOutcome()
    removed: list[int] = []
    failure: list[BaseException] = []

    def index_work() -> None:
        try:
            count = index.remove(union_ints(plan.quarantine, plan.purge)) if index is not None else 0
            if count and index is not None:
                index.save()
            removed.append(count)
        except BaseException as exc:  # surfaced below, before the commit
            failure.append(exc)

    worker = threading.Thread(target=index_work, name="rvu-index-removals")
    with store.transaction():
        worker.start()
        try:
            outcome.tainted = store.mark_tainted(plan.flag, {**details, "tier": "flag"})
            outcome.adapters_tainted = store.mark_adapters_tainted(
                plan.tainted_adapters, {**details, "reason": "closure_v2"}
            )
            fault.step("flag")
            outcome.quarantined = store.quarantine(
                plan.quarantine, plan.quarantine_risk, {**details, "tier": "quarantine"}
            )
            fault.step("quarantine")
            outcome.purged = store.purge(plan.purge, {**details, "tier": "purge"})
            fault.step("purge")
            outcome.evicted, outcome.unloaded = store.evict_adapters(plan.evict_adapters, {**details, "tier": "evict"})
            fault.step("evict")
        finally:
            worker.join()
        if failure:
            raise StoreError(
                f"Updating the vector index failed; the store was left unchanged: {failure[0]}"
            ) from failure[0]
        outcome.vectors_removed = removed[0]
        fault.step("index")
    fault.step("commit")
    if outcome.evicted.size:
        runtime = runtime or NullAdapterRuntime()
        for adapter_id in store.adapter_ids(outcome.evicted):
            runtime.unload(adapter_id)
    return outcome


def restore_entry(
    store: ProvenanceStore, index: VectorIndex | None, entry_id: str, *, reason: str = "operator"
) -> bool:
    """Lift the quarantine of ``entry_id``: store first, then its vector goes back into the index.

    Returns False when the entry was already restored; raises RestoreError when it was never
    quarantined or is purged, EntryNotFoundError when the id is unknown.
    """
    before = store.entry(entry_id)
    restored = store.restore(entry_id, {"reason": reason, "contamination": round(before.contamination_score, 12)})
    entry = store.entry(entry_id)
    if index is not None and not entry.quarantined and not entry.purged and not index.contains([entry.seq])[0]:
        vectors = store.vectors([entry.seq]) if store.has_vector(entry.seq) else None
        if vectors is not None:
            index.add([entry.seq], vectors)
            index.save()
    return restored


# ------------------------------------------------------------------------------------ operator decisions


@dataclass(frozen=True)
class RestoreDecision:
    """The latest ``restored`` event of one entry: when (event seq), why, and P(e) at that moment."""

    seq: int
    event_seq: int
    reason: str
    contamination: float | None


def restore_decisions(store: ProvenanceStore) -> dict[int, RestoreDecision]:
    """Every entry whose quarantine an operator lifted, by entry seq (the latest decision wins)."""
    decisions: dict[int, RestoreDecision] = {}
    for event in store.events("restored"):
        score = event.details.get("contamination")
        for seq in event.subjects:
            decisions[int(seq)] = RestoreDecision(
                seq=int(seq),
                event_seq=event.seq,
                reason=str(event.details.get("reason", "operator")),
                contamination=float(score) if isinstance(score, int | float) else None,
            )
    return decisions


def _first_ingest_event(store: ProvenanceStore, incident_id: str) -> int | None:
    for event in store.events("ingested"):
        if event.details.get("incident_id") == incident_id:
            return event.seq
    return None


def keep_operator_restores(
    store: ProvenanceStore, plan: TierPlan, *, incident_id: str, named: np.ndarray
) -> tuple[TierPlan, dict[int, RestoreDecision]]:
    """Drop from the plan's quarantine and purge every entry an operator restored, unless new evidence.

    Re-running the evidence that got an entry quarantined must not undo the operator's restore. New
    evidence is: its P(contaminated | e) rose above the value recorded at the restore, or an incident
    first ingested after the restore names it (``named``: this incident's entries and their parents).
    The entries stay flagged (tainted). Returns the plan to apply and the decisions it kept, by seq.
    """
    decisions = restore_decisions(store)
    isolated = union_ints(plan.quarantine, plan.purge)
    candidates = [seq for seq in isolated.tolist() if seq in decisions]
    if not candidates:
        return plan, {}
    states = store.entry_states(np.asarray(candidates, dtype=np.int64))
    scores = store.contamination_scores()
    ingested = _first_ingest_event(store, incident_id)
    named_set = set(np.asarray(named, dtype=np.int64).tolist())
    kept: dict[int, RestoreDecision] = {}
    for seq, quarantined, purged in zip(candidates, states["quarantined"], states["purged"], strict=True):
        decision = decisions[seq]
        if quarantined or purged:  # isolated again since: the decision no longer holds
            continue
        score_rose = decision.contamination is not None and round(float(scores[seq]), 12) > decision.contamination
        newly_named = seq in named_set and ingested is not None and ingested > decision.event_seq
        if not (score_rose or newly_named):
            kept[seq] = decision
    if not kept:
        return plan, {}
    drop = np.asarray(sorted(kept), dtype=np.int64)
    keep_quarantine = ~np.isin(plan.quarantine, drop)
    return (
        TierPlan(
            flag=plan.flag,
            quarantine=plan.quarantine[keep_quarantine],
            quarantine_risk=np.asarray(plan.quarantine_risk)[keep_quarantine],
            purge=plan.purge[~np.isin(plan.purge, drop)],
            evict_adapters=plan.evict_adapters,
            tainted_adapters=plan.tainted_adapters,
        ),
        kept,
    )
