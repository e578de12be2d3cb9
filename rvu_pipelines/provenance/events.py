"""The store's append-only event log: event kinds and the hash that chains each event to the one before.

Engine-neutral, so every store implementation writes and verifies the same chain.
"""

from __future__ import annotations

from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.provenance.canonical import canonical_bytes

GENESIS_HASH = "0" * 64
EVENT_KINDS = (
    "ingested", "contamination_scored", "tainted", "quarantined", "restored", "purged", "evicted",
    "adapter_loaded", "adapter_unloaded", "adapter_fused",
)


def _event_hash(seq: int, kind: str, subject_type: str, subjects_json: str, details_json: str,
                created_at_us: int, prev_hash: str) -> str:
    payload = {
        "seq": seq, "kind": kind, "subject_type": subject_type, "subjects": subjects_json,
        "details": details_json, "created_at_us": created_at_us, "prev_hash": prev_hash,
    }
    return sha256_bytes(canonical_bytes(payload))
