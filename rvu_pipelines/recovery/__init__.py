"""Recovery: FROC risk, tier actions on the store and the vector index, signed v2 certificates.

Plain Python (no Dagster). ``recover(...)`` runs the whole pipeline for every caller: the CLI, the
agents' episode runner and the Dagster ``incident_recovery`` asset (once per incident). The stage
functions in ``pipeline`` are its steps, public for tests and the paper reproductions (``reproductions``).
"""

from rvu_pipelines.models.embedding import Embedder, HashingEmbedder
from rvu_pipelines.recovery.certificate import (
    Verdict,
    check_certificate,
    sign_certificate,
    verify_certificate,
    verify_certificate_bytes,
    write_certificate,
)
from rvu_pipelines.recovery.certificate_body import build_certificate_body
from rvu_pipelines.recovery.contamination import Closures, SeedReport, compute_closures, find_seeds
from rvu_pipelines.recovery.froc import FrocPolicy, InfluenceSource, RecordedInfluence, RiskTable, Tier, compute_risk
from rvu_pipelines.recovery.pipeline import (
    AdapterGate,
    MembershipProbe,
    NotRunProbe,
    RecoveryOptions,
    RecoveryResult,
    contamination_scores,
    detector_identity,
    ingest_incident,
    plan_tiers,
    recover,
    restore,
    score_incident,
    score_risk,
)
from rvu_pipelines.recovery.signing_keys import load_or_create_signing_key, open_signing_key, trusted_fingerprint
from rvu_pipelines.recovery.state import RecoveryFiles, RecoveryPaths
from rvu_pipelines.recovery.tamper_audit import tamper_report
from rvu_pipelines.recovery.tiers import AdapterRuntime, TierOutcome, TierPlan, apply_tiers, restore_entry
from rvu_pipelines.recovery.vector_index import VectorIndex

__all__ = [
    "AdapterGate",
    "AdapterRuntime",
    "Closures",
    "Embedder",
    "FrocPolicy",
    "HashingEmbedder",
    "InfluenceSource",
    "MembershipProbe",
    "NotRunProbe",
    "RecordedInfluence",
    "RecoveryFiles",
    "RecoveryOptions",
    "RecoveryPaths",
    "RecoveryResult",
    "RiskTable",
    "SeedReport",
    "Tier",
    "TierOutcome",
    "TierPlan",
    "VectorIndex",
    "Verdict",
    "apply_tiers",
    "build_certificate_body",
    "check_certificate",
    "compute_closures",
    "compute_risk",
    "contamination_scores",
    "detector_identity",
    "find_seeds",
    "ingest_incident",
    "load_or_create_signing_key",
    "open_signing_key",
    "plan_tiers",
    "recover",
    "restore",
    "restore_entry",
    "score_incident",
    "score_risk",
    "sign_certificate",
    "tamper_report",
    "trusted_fingerprint",
    "verify_certificate",
    "verify_certificate_bytes",
    "write_certificate",
]
