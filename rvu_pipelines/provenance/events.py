"""The store's append-only event log: event kinds, the hash that chains each event to the one before, and
the check that recomputes the chain.

Engine-neutral, so every store implementation writes and verifies the same chain.
"""

from __future__ import annotations

from collections.abc import Iterable

from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.provenance.canonical import canonical_bytes
from rvu_pipelines.provenance.store import ChainReport

GENESIS_HASH = "0" * 64
EVENT_KINDS = (
    "ingested",
    "contamination_scored",
    "tainted",
    "quarantined",
    "restored",
    "purged",
    "evicted",
    "adapter_loaded",
    "adapter_unloaded",
    "adapter_fused",
    "adapter_admitted",  # an adapter gate's verdicts: no adapter row exists yet, so these name no subjects
    "adapter_refused",
)


def event_hash(
    seq: int, kind: str, subject_type: str, subjects_json: str, details_json: str, created_at_us: int, prev_hash: str
) -> str:
    payload = {
        "seq": seq,
        "kind": kind,
        "subject_type": subject_type,
        "subjects": subjects_json,
        "details": details_json,
        "created_at_us": created_at_us,
        "prev_hash": prev_hash,
    }
    return sha256_bytes(canonical_bytes(payload))


def verify_chain(rows: Iterable[tuple]) -> ChainReport:
    """Check stored events, ordered by seq, as (seq, kind, subject_type, subjects_json, details_json,
    created_at_us, prev_hash, hash) tuples: any edit, deletion or reordering breaks the chain."""
    rows = list(rows)
    prev = GENESIS_HASH
    for index, row in enumerate(rows):
        seq, kind, subject_type, subjects, details, created, prev_hash, digest = row
        if int(seq) != index:
            return ChainReport(
                False, len(rows), prev, f"event seq {seq} found where {index} was expected (gap or reorder)"
            )
        if prev_hash != prev:
            return ChainReport(
                False, len(rows), prev, f"event {seq}: prev_hash does not match the previous event's hash"
            )
        if event_hash(int(seq), kind, subject_type, subjects, details, int(created), prev_hash) != digest:
            return ChainReport(False, len(rows), prev, f"event {seq}: content does not match its hash (edited)")
        prev = digest
    return ChainReport(True, len(rows), prev)
