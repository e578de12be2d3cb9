"""What an ingest must write, decided without SQL: validation against what is stored, then the row plan.

Every store engine (DuckDB, PostgreSQL) asks its tables the same three questions (which of these entry ids
exist, which adapters exist, the next free seqs), hands the answers here, and writes the plan it gets back.
Keeping the rules here means the engines cannot disagree on what a valid incident is or which seq a row gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from rvu_pipelines.errors import IncidentValidationError, StoreError
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.provenance.incident import IncidentIssue, IncidentLog, IncidentRecord


@dataclass(frozen=True)
class StoredEntry:
    """An entry already in the store, as ingest needs it."""

    seq: int
    record_hash: str
    incident_id: str


@dataclass(frozen=True)
class StoredAdapter:
    seq: int
    load_entry_id: str


@dataclass(frozen=True)
class IngestPlan:
    """The rows one ingest writes. ``entry_columns`` holds the new entries (numpy columns, engine-neutral names)."""

    seqs: np.ndarray  # seq of every record, file order
    new_rows: list[int]  # record indices of entries not yet stored
    entry_columns: dict[str, np.ndarray]
    present: list[int]  # record indices already stored (their scores may rise)
    scores: np.ndarray  # P(contaminated) per record
    new_adapters: list[dict[str, Any]]  # adapter_provenance rows to insert, in seq order
    unloads: list[tuple[int, float]]  # (adapter seq, timestamp) of new adapter_unloaded lines, file order
    fusions: list[int]  # adapter seqs of new adapter_fused lines, file order
    refusals: list[dict[str, Any]]  # event details of new adapter_refused lines, file order (no adapter row)


@dataclass(frozen=True)
class SyntheticGraph:
    """A whole graph for ``bulk_load`` (benchmarks, migrations): entries in seq order (parents first), int64
    parent / adapter seqs (-1: none), P(contaminated) per entry, adapter ids and their influence."""

    entry_ids: np.ndarray
    parent_seq: np.ndarray
    adapter_seq: np.ndarray
    contamination: np.ndarray
    adapter_ids: np.ndarray
    influence: np.ndarray
    vectors: np.ndarray | None = None
    episode_ids: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(np.asarray(self.parent_seq).size)


def contamination_column(incident: IncidentLog, contamination: Mapping[str, float] | None) -> np.ndarray:
    return np.array([float((contamination or {}).get(r.entry_id, 0.0)) for r in incident.records], dtype=np.float64)


def checked_vectors(
    vectors: np.ndarray | None,
    incident: IncidentLog,
    stored_dim: int | None,
    store_label: str,
    stored_embedder: str | None,
) -> np.ndarray | None:
    """Vectors as contiguous float32, one row per record, of the store's dimension (StoreError otherwise)."""
    if vectors is None:
        return None
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(incident.records):
        raise StoreError("vectors must have one row per incident record")
    if stored_dim is not None and vectors.shape[1] != stored_dim:
        raise StoreError(
            f"Store {store_label} holds {stored_dim}-d vectors ({stored_embedder}); got {vectors.shape[1]}-d."
        )
    return vectors


def validate(
    incident: IncidentLog,
    existing: Mapping[str, StoredEntry],
    parents: Mapping[str, StoredEntry],
    adapters: Mapping[str, StoredAdapter],
) -> None:
    """Raise IncidentValidationError (every problem, by line) if the incident conflicts with the store."""
    issues: list[IncidentIssue] = []
    for record in incident.records:
        known = existing.get(record.entry_id)
        if known is not None and known.record_hash != record.record_hash:
            issues.append(
                IncidentIssue(
                    incident.path,
                    record.line,
                    "entry_id",
                    f"entry {record.entry_id!r} is already in the store with different "
                    f"content (from incident {known.incident_id})",
                )
            )
    for parent, lines in incident.external_parents.items():
        if parent not in parents:
            issues.extend(
                IncidentIssue(
                    incident.path,
                    line,
                    "parent_id",
                    f"parent {parent!r} is neither on an earlier line nor in the store",
                )
                for line in lines
            )
    refused = {record.adapter_id: record.line for record in incident.adapters_refused}
    for adapter, lines in incident.external_adapters.items():
        if adapter not in adapters:
            note = f" (line {refused[adapter]} says the adapter gate refused it)" if adapter in refused else ""
            issues.extend(
                IncidentIssue(
                    incident.path,
                    line,
                    incident.adapter_field(line),
                    f"adapter {adapter!r} is neither loaded on an earlier line nor in the store; "
                    f"load it with an adapter_loaded line first{note}",
                )
                for line in lines
            )
    for record in incident.adapters_loaded:
        stored = adapters.get(record.adapter_id or "")
        if stored is not None and stored.load_entry_id != record.entry_id:
            issues.append(
                IncidentIssue(
                    incident.path,
                    record.line,
                    "adapter_id",
                    f"adapter {record.adapter_id!r} was already loaded by entry {stored.load_entry_id!r}",
                )
            )
    if issues:
        issues.sort(key=lambda issue: (issue.line, issue.field))
        raise IncidentValidationError(incident.path, issues)


def plan(
    incident: IncidentLog,
    existing: Mapping[str, StoredEntry],
    parents: Mapping[str, StoredEntry],
    adapters: Mapping[str, StoredAdapter],
    scores: np.ndarray,
    next_entry: int,
    next_adapter: int,
) -> IngestPlan:
    """Assign seqs (new entries and adapters continue the store's dense numbering, in file order) and build
    the rows. Call :func:`validate` first."""
    records = incident.records
    entry_seq: dict[str, int] = {key: value.seq for key, value in existing.items()}
    entry_seq.update({key: value.seq for key, value in parents.items()})
    adapter_seq: dict[str, int] = {key: value.seq for key, value in adapters.items()}
    new_rows: list[int] = []
    new_adapters: list[dict[str, Any]] = []
    for index, record in enumerate(records):
        if record.kind == "adapter_loaded" and record.adapter_id not in adapter_seq:
            adapter_seq[cast(str, record.adapter_id)] = next_adapter
            new_adapters.append(
                {
                    "adapter_id": record.adapter_id,
                    "adapter_name": record.adapter_name,
                    "adapter_hash": record.adapter_hash,
                    "source": record.source,
                    "loaded_at": record.timestamp,
                    "parent_adapter_id": record.parent_adapter_id,
                    "episode_id": record.episode_id,
                    "seq": next_adapter,
                    "influence": record.influence,
                    "load_entry_id": record.entry_id,
                }
            )
            next_adapter += 1
        if record.entry_id not in existing:
            entry_seq[record.entry_id] = next_entry
            new_rows.append(index)
            next_entry += 1
    seqs = np.array([entry_seq[record.entry_id] for record in records], dtype=np.int64)
    chosen = [records[i] for i in new_rows]

    def column(values: list[Any]) -> np.ndarray:
        return np.array(values, dtype=object)

    entry_columns = {
        "entry_id": column([r.entry_id for r in chosen]),
        "episode_id": column([r.episode_id for r in chosen]),
        "action_type": column([r.action_type for r in chosen]),
        "content": column([r.content for r in chosen]),
        "content_hash": column([sha256_bytes(r.content.encode("utf-8")) for r in chosen]),
        "parent_id": column([r.parent_id for r in chosen]),
        "ts": np.array([r.timestamp for r in chosen], dtype=np.float64),
        "active_adapter_id": column([r.active_adapter_id for r in chosen]),
        "seq": seqs[new_rows],
        "parent_seq": np.array([entry_seq[r.parent_id] if r.parent_id else -1 for r in chosen], dtype=np.int64),
        "adapter_seq": np.array(
            [adapter_seq[r.active_adapter_id] if r.active_adapter_id else -1 for r in chosen], dtype=np.int64
        ),
        "score": scores[new_rows],
        "record_hash": column([r.record_hash for r in chosen]),
        "line_no": np.array([r.line for r in chosen], dtype=np.int64),
    }
    unloads = [
        (adapter_seq[cast(str, records[i].adapter_id)], records[i].timestamp)
        for i in new_rows
        if records[i].kind == "adapter_unloaded"
    ]
    fusions = [adapter_seq[cast(str, records[i].adapter_id)] for i in new_rows if records[i].kind == "adapter_fused"]
    refusals = [_refusal_details(records[i]) for i in new_rows if records[i].kind == "adapter_refused"]
    present = [i for i, r in enumerate(records) if r.entry_id in existing]
    return IngestPlan(seqs, new_rows, entry_columns, present, scores, new_adapters, unloads, fusions, refusals)


def _refusal_details(record: IncidentRecord) -> dict[str, Any]:
    """An ``adapter_refused`` event's details: the refused adapter has no row to name, so the event carries it."""
    return {
        "entry_id": record.entry_id,
        "adapter_id": record.adapter_id,
        "adapter_hash": record.adapter_hash,
        "source": record.source,
        "reason": record.reason,
    }
