"""The recovery pipeline: incident log -> seeds -> closure v1/v2 -> FROC risk -> tiers -> certificate.

:func:`recover` runs it end to end. It is what every caller uses: the CLI's ``rvu recover``, the
agents' episode runner and the Dagster ``incident_recovery`` asset, which calls it once per incident
partition and publishes each stage's outcome (store, closure, risk, tiers, certificate) from the
returned :class:`RecoveryResult`. The stage functions below it (``ingest_incident``, ``find_seeds``,
``compute_closures``, ``score_risk``, ``plan_tiers``) are its steps, public for tests and for the
seed reproductions. Every stage is deterministic and idempotent: re-running the same incident against
the same store changes nothing more and yields a byte-identical certificate, also after a crash
half-way through the tiers.

Extension points, each with a default:

- the contamination detector: any :class:`~rvu_pipelines.detectors.base.InjectionDetector` (texts ->
  P(injection)), as the memory monitor and the attack harness take it; default
  :class:`~rvu_pipelines.detectors.exfiltration.ExfiltrationHeuristic`. The pipeline scores only action
  records (adapter lifecycle lines score 0) and records the detector's ``name`` and ``version``
  (default "1") in the certificate;
- ``InfluenceSource`` (froc.py): I(adapter) (default: the ``influence`` recorded in the log);
- ``AdapterGate``: screening of each loaded adapter, reported in the certificate (default: not run);
- ``MembershipProbe``: post-recovery probes (default: ``{"status": "not run"}`` with the reason;
  ``adapters.eviction_probe`` measures every adapter the recovery evicted);
- ``AdapterRuntime`` (tiers.py): unloading evicted adapters from a live runtime;
- ``LingeringState``: purging what evicted adapters left on the runtime (cached answers, KV states;
  ``adapters.lingering.LingeringPurge``), reported as ``adapter_attestation.lingering`` when the plan
  evicts an adapter;
- the store: any :class:`~rvu_pipelines.provenance.store.ProvenanceStore`, opened by ``open_store``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import numpy as np

from rvu_pipelines.detectors.base import InjectionDetector
from rvu_pipelines.detectors.exfiltration import ExfiltrationHeuristic
from rvu_pipelines.errors import ConfigError, StoreError
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.models.embedding import Embedder, HashingEmbedder, embedder_name
from rvu_pipelines.provenance.canonical import canonical_bytes
from rvu_pipelines.provenance.closure import ProvenanceGraph
from rvu_pipelines.provenance.engines import describe_store, open_store, store_exists
from rvu_pipelines.provenance.incident import IncidentLog, IncidentRecord, load_incident
from rvu_pipelines.provenance.intsets import union_ints
from rvu_pipelines.provenance.store import AdapterRow, IngestResult, ProvenanceStore
from rvu_pipelines.recovery.certificate import check_writable, sign_certificate, write_certificate
from rvu_pipelines.recovery.certificate_body import build_certificate_body
from rvu_pipelines.recovery.contamination import Closures, SeedReport, compute_closures, find_seeds
from rvu_pipelines.recovery.first_ingest import MadeBeforeIngest, check_against_new_store, undone_unless_ingested
from rvu_pipelines.recovery.froc import FrocPolicy, InfluenceSource, RecordedInfluence, RiskTable, Tier, compute_risk
from rvu_pipelines.recovery.signing_keys import PRIVATE_KEY_FILE, check_signing_key, open_signing_key
from rvu_pipelines.recovery.state import RecoveryFiles
from rvu_pipelines.recovery.tiers import (
    AdapterRuntime,
    FaultHook,
    TierOutcome,
    TierPlan,
    apply_tiers,
    keep_operator_restores,
    restore_decisions,
    restore_entry,
)
from rvu_pipelines.recovery.vector_index import VectorIndex

# ------------------------------------------------------------------------------------ extension points


DEFAULT_DETECTOR_VERSION = "1"


def detector_identity(detector: InjectionDetector) -> dict[str, str]:
    """The certificate's detector section: the detector's ``name`` and ``version`` (``"1"`` if it has none)."""
    return {
        "name": str(getattr(detector, "name", type(detector).__name__)),
        "version": str(getattr(detector, "version", DEFAULT_DETECTOR_VERSION)),
    }


def contamination_scores(records: Sequence[IncidentRecord], detector: InjectionDetector) -> np.ndarray:
    """The detector's P(contaminated | e) for each record, in [0, 1].

    Only action records are scored: their content is what an agent read or wrote. Adapter lifecycle
    lines (load / unload / fuse) hold adapter metadata, not text an agent saw, and score 0.
    """
    scores = np.zeros(len(records), dtype=np.float64)
    actions = [i for i, record in enumerate(records) if record.is_action]
    if actions:
        detected = np.asarray(detector.score([records[i].content for i in actions]), dtype=np.float64)
        if detected.shape != (len(actions),):
            name = detector_identity(detector)["name"]
            raise ValueError(f"detector {name} returned {detected.shape} scores for {len(actions)} texts")
        scores[actions] = np.clip(detected, 0.0, 1.0)
    return scores


@runtime_checkable
class AdapterGate(Protocol):
    """Pre-load screening of an adapter (allowlist, Safe LoRA, OOD: ``adapters.gate``)."""

    name: str

    def screen(self, adapter: IncidentRecord) -> Mapping[str, Any]: ...


@runtime_checkable
class MembershipProbe(Protocol):
    """Post-recovery membership-inference probes (Theorem 5); returns the certificate section."""

    def run(self, store: ProvenanceStore, purged_entry_ids: Sequence[str]) -> Mapping[str, Any]: ...


@runtime_checkable
class LingeringState(Protocol):
    """What evicted adapters left on the agent's runtime (cached answers, KV states), purged after the tiers;
    returns the certificate's ``adapter_attestation.lingering`` section (``adapters.lingering.LingeringPurge``)."""

    def run(self, store: ProvenanceStore, evicted: Sequence[AdapterRow]) -> Mapping[str, Any]: ...


NO_LINGERING_STORES = "no runtime stores were given (rvu recover passes the response cache and KV folder)"


class NotRunProbe:
    """No probe: the certificate says so plainly, and why, instead of claiming a verdict."""

    def __init__(self, reason: str = "no membership probe was given (rvu recover passes one)") -> None:
        self.reason = reason

    def run(self, store: ProvenanceStore, purged_entry_ids: Sequence[str]) -> Mapping[str, Any]:
        return {"status": "not run", "reason": self.reason}


ClosureMode = Literal["v1", "v2"]
CLOSURE_MODES: tuple[str, ...] = get_args(ClosureMode)


@dataclass(frozen=True)
class RecoveryOptions:
    """How one recovery decides, and what it plugs in; every field has the default the module doc names.

    ``closure_mode="v1"`` reproduces the RVU v1 baseline (the attack table's rvu_v1 defense): the recovery acts
    on the parent/child closure only and purges all of it (binary purge, no graduated tiers, no adapter
    eviction); the certificate then says ``runtime_recovery.closure_mode: "v1"``. ``max_depth`` overrides the
    policy's closure depth bound. ``new_key``: create a signing key even where earlier recoveries used one that
    is gone (their certificates then no longer verify against this folder's key)."""

    detector: InjectionDetector | None = None
    policy: FrocPolicy | None = None
    embedder: Embedder | None = None
    influence: InfluenceSource | None = None
    gate: AdapterGate | None = None
    probe: MembershipProbe | None = None
    runtime: AdapterRuntime | None = None
    lingering: LingeringState | None = None
    closure_mode: ClosureMode = "v2"
    max_depth: int | None = None
    new_key: bool = False

    def __post_init__(self) -> None:
        if self.closure_mode not in CLOSURE_MODES:
            raise ConfigError(
                f"Invalid closure_mode '{self.closure_mode}' for recover(); allowed values: {', '.join(CLOSURE_MODES)}."
            )


# ------------------------------------------------------------------------------------ results


@dataclass
class RecoveryResult:
    """Everything one recovery produced (ids are entry/adapter ids as in the incident log)."""

    incident_id: str
    certificate_path: Path
    certificate: dict[str, Any]
    seeds: list[str]
    closure_v1: list[str]
    closure_v2: list[str]
    tainted_adapters: list[str]
    evicted_adapters: list[str]
    risk_scores: dict[str, float]
    tiers: dict[str, str]
    tier_counts: dict[str, int]
    applied: dict[str, int]
    ingest: IngestResult
    timings: dict[str, float] = field(default_factory=dict)
    resulting_state: dict[str, str] = field(default_factory=dict)  # entry id -> state after this run
    kept_restored: list[str] = field(default_factory=list)  # left restored by an operator's decision
    truncated_at_depth: int | None = None  # the closure's depth bound, when it cut entries off
    entries_beyond_depth: int = 0
    key_fingerprint: str = ""
    key_created: bool = False  # this run created the signing key (callers say so)
    risk_notes: list[str] = field(default_factory=list)  # tiers no entry could reach (froc.unreachable_tiers)

    def metrics(self) -> dict[str, float]:
        """Flat numbers for MLflow: closure sizes, tier counts, what changed, stage timings."""
        out: dict[str, float] = {
            "seeds": len(self.seeds),
            "closure_v1_size": len(self.closure_v1),
            "closure_v2_size": len(self.closure_v2),
            "adapter_expansion_gain": len(self.closure_v2) - len(self.closure_v1),
            "tainted_adapters": len(self.tainted_adapters),
            "evicted_adapters": len(self.evicted_adapters),
            "new_entries": self.ingest.new_entries,
        }
        out.update({f"tier_{name}": count for name, count in self.tier_counts.items()})
        out.update({f"applied_{name}": count for name, count in self.applied.items()})
        out["entries_beyond_depth"] = self.entries_beyond_depth
        out["kept_restored"] = len(self.kept_restored)
        out.update({f"seconds_{name}": value for name, value in self.timings.items()})
        return out


# ------------------------------------------------------------------------------------ stages


def score_incident(
    incident: IncidentLog, detector: InjectionDetector | None = None
) -> tuple[dict[str, float], dict[str, list[str]]]:
    """P(contaminated | e) for each record: max of the log's flag (1.0) and the detector; plus sources."""
    detector = detector or ExfiltrationHeuristic()
    detected = contamination_scores(incident.records, detector)
    identity = detector_identity(detector)
    scores: dict[str, float] = {}
    sources: dict[str, list[str]] = {}
    for record, value in zip(incident.records, detected.tolist(), strict=True):
        found = []
        if record.contaminated:
            found.append("log_flag")
        if value > 0:
            found.append(f"detector:{identity['name']}-v{identity['version']}")
        scores[record.entry_id] = max(1.0 if record.contaminated else 0.0, float(value))
        sources[record.entry_id] = found
    return scores, sources


@dataclass(frozen=True)
class PreparedIngest:
    """An incident scored and embedded, ready to write: the slow part of an ingest, which needs no store."""

    incident: IncidentLog
    scores: dict[str, float]
    sources: dict[str, list[str]]
    vectors: np.ndarray
    embedder: str

    def write(self, store: ProvenanceStore) -> IngestResult:
        """Validate against the store and write (all or nothing)."""
        return store.ingest(self.incident, contamination=self.scores, vectors=self.vectors, embedder=self.embedder)


def prepare_ingest(
    incident: IncidentLog, *, detector: InjectionDetector | None = None, embedder: Embedder | None = None
) -> PreparedIngest:
    """Score and embed the incident (done before recovery creates anything, so a failure here leaves nothing)."""
    scores, sources = score_incident(incident, detector)
    embedder = embedder or HashingEmbedder()
    vectors = np.asarray(embedder.encode([record.content for record in incident.records]), dtype=np.float32)
    return PreparedIngest(incident, scores, sources, vectors, embedder_name(embedder))


def ingest_incident(
    store: ProvenanceStore,
    incident: IncidentLog,
    *,
    detector: InjectionDetector | None = None,
    embedder: Embedder | None = None,
) -> tuple[IngestResult, dict[str, list[str]]]:
    """Validate against the store, score and embed the incident, and write it (all or nothing)."""
    prepared = prepare_ingest(incident, detector=detector, embedder=embedder)
    return prepared.write(store), prepared.sources


def score_risk(
    store: ProvenanceStore,
    graph: ProvenanceGraph,
    closures: Closures,
    policy: FrocPolicy,
    influence: InfluenceSource | None = None,
) -> RiskTable:
    """FROC risk and tier of every entry in the v2 closure."""
    influence = influence or RecordedInfluence()
    return compute_risk(
        graph,
        closures.v2.members,
        store.contamination_scores(),
        influence.adapter_influence(store),
        policy,
        tainted_adapters=closures.v2.tainted_adapters,
    )


def plan_tiers(risk: RiskTable, graph: ProvenanceGraph, closures: Closures, seeds: SeedReport) -> TierPlan:
    """Tier plan from the risk table; contamination seeds are always at least flagged."""
    plan = TierPlan.from_risk(risk, graph, closures.v2.tainted_adapters)
    return TierPlan(
        flag=union_ints(plan.flag, seeds.seqs),
        quarantine=plan.quarantine,
        quarantine_risk=plan.quarantine_risk,
        purge=plan.purge,
        evict_adapters=plan.evict_adapters,
        tainted_adapters=plan.tainted_adapters,
    )


def _gate_section(gate: AdapterGate | None, incident: IncidentLog) -> dict[str, Any]:
    if gate is None:
        return {"status": "not run", "reason": "no adapter gate was given (rvu recover passes adapters.ScreeningGate)"}
    return {
        "status": "run",
        "gate": gate.name,
        "results": {r.adapter_id: dict(gate.screen(r)) for r in incident.adapters_loaded},
    }


# ------------------------------------------------------------------------------------ end to end


def with_max_depth(policy: FrocPolicy, max_depth: int | None) -> FrocPolicy:
    """``policy`` with its closure depth bound replaced (validated like the config file); unchanged for None."""
    if max_depth is None:
        return policy
    data = policy.model_dump()
    data["closure"] = {**data.get("closure", {}), "max_depth": max_depth}
    try:
        return FrocPolicy.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"Invalid closure depth {max_depth}: {exc}") from None


def prior_recoveries(store: ProvenanceStore | None, certificates_dir: Path | str | None) -> list[str]:
    """What an earlier signing key left behind: certificates in ``certificates_dir``, incidents in the store
    (``None``: no store exists yet)."""
    found: list[str] = []
    if certificates_dir is not None:
        folder = Path(certificates_dir)
        count = sum(1 for _ in folder.glob("*.json")) if folder.is_dir() else 0
        if count:
            found.append(f"{count} certificate(s) in {folder}")
    if store is None:
        return found
    incidents = {event.details.get("incident_id") for event in store.events("ingested")} - {None}
    if incidents:
        found.append(f"{len(incidents)} incident(s) recovered in the store {store.path}")
    return found


def check_before_models(incident: IncidentLog, files: RecoveryFiles, new_key: bool = False) -> None:
    """The refusals of :func:`recover` that need no model, for callers to make before they load a detector or an
    embedder: a log a new store would refuse, an unwritable certificate path, a lost signing key. Changes nothing
    but the certificate's folder, created when missing (as :func:`recover` creates it)."""
    check_against_new_store(incident, files.store)
    check_writable(files.certificate)
    if (files.keys / PRIVATE_KEY_FILE).exists():  # what earlier recoveries left matters only without a key
        prior: list[str] = []
    elif MadeBeforeIngest.before(files.store, files.keys).store_is_new or str(files.store) == ":memory:":
        prior = prior_recoveries(None, files.certificates)
    else:
        with open_store(files.store, read_only=True) as store:
            prior = prior_recoveries(store, files.certificates)
    check_signing_key(files.keys, prior_use=prior, new_key=new_key)


def recover(
    incident_path: IncidentLog | Path | str, files: RecoveryFiles, options: RecoveryOptions | None = None
) -> RecoveryResult:
    """Recover from one incident log and write its signed certificate to ``files.certificate``.

    Nothing changes before every check passed: the log validates (against a new store too:
    :func:`check_against_new_store`), the certificate path is writable, the log is scored and embedded, and the
    signing key exists or may be created. A missing key is created only where no earlier recovery
    (certificates in ``files.certificates``, incidents in the store) would be orphaned by it, unless
    ``options.new_key``. If the ingest still refuses the log, the key and store file this run created are
    removed again. Entries an operator restored stay restored unless new evidence arrived.
    Raises IncidentValidationError (nothing ingested) for a bad log, ConfigError for a bad policy,
    CertificateOutputError for an unwritable certificate path, SigningKeyError for a lost key.
    """
    options = options or RecoveryOptions()
    closure_mode, new_key, influence = options.closure_mode, options.new_key, options.influence
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    policy = with_max_depth(options.policy or FrocPolicy.load(), options.max_depth)
    detector = options.detector or ExfiltrationHeuristic()
    embedder = options.embedder or HashingEmbedder()
    # an IncidentLog the caller already validated is used as is: the file is not read a second time
    incident = incident_path if isinstance(incident_path, IncidentLog) else load_incident(incident_path)
    # every refusal that needs no model, before the log is scored and embedded
    check_before_models(incident, files, new_key)
    lap("validate")
    prepared = prepare_ingest(incident, detector=detector, embedder=embedder)
    sources = prepared.sources
    made = MadeBeforeIngest.before(files.store, files.keys)
    if made.store_is_new:
        # no store yet: settle the key before the store file is created, so a refusal leaves nothing behind
        made.key = open_signing_key(files.keys, prior_use=prior_recoveries(None, files.certificates), new_key=new_key)
    with undone_unless_ingested(made), open_store(files.store) as store:
        made.claim_store(files.store, store)
        if made.key is None:
            made.key = open_signing_key(
                files.keys, prior_use=prior_recoveries(store, files.certificates), new_key=new_key
            )
        key = made.key
        ingest = prepared.write(store)
        made.ingested = True
        index = VectorIndex.open(files.index, store, dimension=embedder.dimension) if files.index is not None else None
        lap("ingest")
        seeds = find_seeds(store, incident, policy, sources)
        graph = store.graph()
        closures = compute_closures(graph, seeds.seqs, policy)
        if closure_mode == "v1":  # act on the parent/child closure alone
            closures = Closures(
                v1=closures.v1, v2=closures.v1, v1_beyond=closures.v1_beyond, v2_beyond=closures.v1_beyond
            )
        lap("closure")
        risk = score_risk(store, graph, closures, policy, influence)
        if closure_mode == "v1":  # binary purge: every closure member is purged
            risk = replace(risk, tier=np.full(risk.tier.shape, int(Tier.PURGE), dtype=risk.tier.dtype))
        lap("risk")
        incident_seqs = store.incident_seqs(incident)
        named = union_ints(incident_seqs, graph.parent[incident_seqs][graph.parent[incident_seqs] >= 0])
        plan, kept = keep_operator_restores(
            store, plan_tiers(risk, graph, closures, seeds), incident_id=incident.incident_id, named=named
        )
        outcome: TierOutcome = apply_tiers(
            store,
            index,
            plan,
            details={"incident_id": incident.incident_id},
            runtime=options.runtime,
            fault=FaultHook.configured(),
        )
        lap("tiers")
        lingering_section: Mapping[str, Any] | None = None
        if plan.evict_adapters.size:  # before the probe, so it measures what the purge left
            evicted_rows = store.adapters(plan.evict_adapters)
            lingering_section = (
                options.lingering.run(store, evicted_rows)
                if options.lingering is not None
                else {"status": "not run", "reason": NO_LINGERING_STORES}
            )
        purged_ids = store.entry_ids(plan.purge)
        probe_section = (options.probe or NotRunProbe()).run(store, purged_ids)
        kept_ids = store.entry_ids(sorted(kept))
        body = build_certificate_body(
            store,
            index,
            incident,
            policy,
            detector_identity(detector),
            seeds,
            closures,
            risk,
            plan,
            probe_section,
            _gate_section(options.gate, incident),
            restored=sorted(restore_decisions(store)),
            kept_restored={entry_id: kept[seq].reason for entry_id, seq in zip(kept_ids, sorted(kept), strict=True)},
        )
        if closure_mode == "v1":
            body["runtime_recovery"]["closure_mode"] = "v1"
        if lingering_section is not None:
            body["adapter_attestation"]["lingering"] = dict(lingering_section)
        certificate = sign_certificate(body, key)
        path = write_certificate(certificate, files.certificate)
        lap("certificate")
        risk_ids = store.entry_ids(risk.seqs)
        runtime_section = certificate["runtime_recovery"]
        return RecoveryResult(
            incident_id=incident.incident_id,
            certificate_path=path,
            certificate=certificate,
            seeds=sorted(seeds.entry_ids),
            closure_v1=sorted(store.entry_ids(closures.v1.members)),
            closure_v2=sorted(store.entry_ids(closures.v2.members)),
            tainted_adapters=sorted(store.adapter_ids(closures.v2.tainted_adapters)),
            evicted_adapters=sorted(store.adapter_ids(plan.evict_adapters)),
            risk_scores={e: float(s) for e, s in zip(risk_ids, risk.score.tolist(), strict=True)},
            tiers={e: Tier(int(t)).label for e, t in zip(risk_ids, risk.tier.tolist(), strict=True)},
            tier_counts=risk.counts(),
            applied=outcome.counts(),
            ingest=ingest,
            timings=timings,
            resulting_state=dict(runtime_section["resulting_state"]["entries"]),
            kept_restored=sorted(kept_ids),
            truncated_at_depth=runtime_section["truncated_at_depth"],
            entries_beyond_depth=int(runtime_section["entries_beyond_depth"]),
            key_fingerprint=key.fingerprint,
            key_created=key.created,
            risk_notes=list(risk.warnings),
        )


def restore(entry_id: str, store_path: Path | str, index_path: Path | str | None, *, reason: str = "operator") -> bool:
    """Lift the quarantine of one entry (``rvu restore``). False if it was already restored.

    The restore is recorded as an operator decision: later recoveries keep the entry restored unless
    new evidence arrives. A missing store is an error, not a new empty one: there is nothing to restore.
    """
    if str(store_path) != ":memory:" and not store_exists(store_path):
        raise StoreError(
            f"No provenance store at {describe_store(store_path)}: nothing was recovered in this state folder, so "
            "there is nothing to restore. Pass --state with the folder `rvu recover` used."
        )
    with open_store(store_path) as store:
        index = VectorIndex.open(index_path, store) if index_path is not None and store.embedding_dim else None
        return restore_entry(store, index, entry_id, reason=reason)


def certificate_digest(certificate: Mapping[str, Any]) -> str:
    """sha256 of a certificate's canonical bytes (handy as a run tag)."""
    return sha256_bytes(canonical_bytes(certificate))
