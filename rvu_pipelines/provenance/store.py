"""What a provenance store hands back: ingest results, entry and adapter rows, events, chain reports.

Engine-neutral: the DuckDB store (:mod:`duckdb_store`) builds these rows from its tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class IngestResult:
    """What an ingest did: new rows, rows already present (same content), and every entry's seq."""

    incident_id: str
    new_entries: int
    already_present: int
    new_adapters: int
    seqs: np.ndarray  # seq of each record of the incident, in file order


@dataclass(frozen=True)
class EntryRow:
    seq: int
    entry_id: str
    episode_id: str
    action_type: str
    content: str
    content_hash: str
    parent_id: str | None
    timestamp: float
    tainted: bool
    purged: bool
    active_adapter_id: str | None
    contamination_score: float
    quarantined: bool


@dataclass(frozen=True)
class AdapterRow:
    seq: int
    adapter_id: str
    adapter_name: str
    adapter_hash: str
    source: str
    loaded_at: float | None
    unloaded_at: float | None
    fused: bool
    tainted: bool
    purged: bool
    influence: float | None
    episode_id: str | None
    load_entry_id: str | None


@dataclass(frozen=True)
class Event:
    seq: int
    kind: str
    subject_type: str
    subjects: list[int]
    details: dict[str, Any]
    created_at_us: int
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class ChainReport:
    """Result of :meth:`ProvenanceStore.verify_event_chain`."""

    ok: bool
    events: int
    head: str
    problem: str = ""
