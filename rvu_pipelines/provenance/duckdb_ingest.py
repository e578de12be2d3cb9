"""Writing incidents into the DuckDB provenance store: validation against what is stored, then one transaction.

Split from :mod:`duckdb_store` for length only: these functions are the store's write path for new
rows (:meth:`DuckDBProvenanceStore.ingest` and ``bulk_load`` call them) and use its connection helpers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from rvu_pipelines.errors import IncidentValidationError, StoreError
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.provenance.incident import IncidentIssue, IncidentLog
from rvu_pipelines.provenance.store import IngestResult

if TYPE_CHECKING:
    from rvu_pipelines.provenance.duckdb_store import DuckDBProvenanceStore


def ingest(
    store: DuckDBProvenanceStore,
    incident: IncidentLog,
    *,
    contamination: Mapping[str, float] | None = None,
    vectors: np.ndarray | None = None,
    embedder: str | None = None,
) -> IngestResult:
    """Write a validated incident: all of it, or (on any problem) nothing.

    Entries already in the store with the same record hash are skipped, so ingesting the same
    file twice changes nothing; an id already present with different content is an error.
    ``contamination`` maps entry id -> P(contaminated) (raised, never lowered, on re-ingest);
    ``vectors`` (one row per record, float32) are stored so the vector index can be rebuilt.
    """
    records = incident.records
    if vectors is not None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(records):
            raise StoreError("vectors must have one row per incident record")
    scores = np.array([float((contamination or {}).get(r.entry_id, 0.0)) for r in records], dtype=np.float64)
    issues: list[IncidentIssue] = []
    with store.transaction():
        existing = _existing_entries(store, incident.entry_ids)
        for record in records:
            if record.entry_id in existing and existing[record.entry_id][1] != record.record_hash:
                issues.append(
                    IncidentIssue(
                        incident.path,
                        record.line,
                        "entry_id",
                        f"entry {record.entry_id!r} is already in the store with different "
                        f"content (from incident {existing[record.entry_id][2]})",
                    )
                )
        parents = _existing_entries(store, list(incident.external_parents))
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
        adapters = _existing_adapters(store)
        for adapter, lines in incident.external_adapters.items():
            if adapter not in adapters:
                issues.extend(
                    IncidentIssue(
                        incident.path,
                        line,
                        incident.adapter_field(line),
                        f"adapter {adapter!r} is neither loaded on an earlier line nor in the store; "
                        "load it with an adapter_loaded line first",
                    )
                    for line in lines
                )
        for record in incident.adapters_loaded:
            known = adapters.get(record.adapter_id or "")
            if known is not None and known[1] != record.entry_id:
                issues.append(
                    IncidentIssue(
                        incident.path,
                        record.line,
                        "adapter_id",
                        f"adapter {record.adapter_id!r} was already loaded by entry {known[1]!r}",
                    )
                )
        dim = store.embedding_dim
        if vectors is not None and dim is not None and vectors.shape[1] != dim:
            raise StoreError(
                f"Store {store.path} holds {dim}-d vectors ({store.embedder_name}); got {vectors.shape[1]}-d."
            )
        if issues:
            issues.sort(key=lambda issue: (issue.line, issue.field))
            raise IncidentValidationError(incident.path, issues)
        result = _write_incident(store, incident, existing, parents, adapters, scores, vectors, embedder)
    return result


def _existing_entries(store: DuckDBProvenanceStore, entry_ids: Sequence[str]) -> dict[str, tuple[int, str, str]]:
    if not entry_ids:
        return {}
    with store._registered({"entry_id": np.array(list(entry_ids), dtype=object)}) as view:
        rows = store._con.execute(
            f"SELECT p.entry_id, p.seq, p.record_hash, p.incident_id FROM provenance p JOIN {view} v USING (entry_id)"
        ).fetchall()
    return {row[0]: (int(row[1]), row[2], row[3]) for row in rows}


def _existing_adapters(store: DuckDBProvenanceStore) -> dict[str, tuple[int, str]]:
    rows = store._con.execute("SELECT adapter_id, seq, load_entry_id FROM adapter_provenance").fetchall()
    return {row[0]: (int(row[1]), row[2]) for row in rows}


def _next_seq(store: DuckDBProvenanceStore, table: str) -> int:
    return int(store._one(f"SELECT coalesce(max(seq) + 1, 0) FROM {table}")[0])


def _write_incident(
    store: DuckDBProvenanceStore,
    incident: IncidentLog,
    existing: dict,
    parents: dict,
    adapters: dict,
    scores: np.ndarray,
    vectors: np.ndarray | None,
    embedder: str | None,
) -> IngestResult:
    records = incident.records
    now = time.time()
    entry_seq: dict[str, int] = {key: value[0] for key, value in existing.items()}
    entry_seq.update({key: value[0] for key, value in parents.items()})
    adapter_seq: dict[str, int] = {key: value[0] for key, value in adapters.items()}
    next_entry, next_adapter = _next_seq(store, "provenance"), _next_seq(store, "adapter_provenance")
    new_rows: list[int] = []
    new_adapters: list[int] = []
    for index, record in enumerate(records):
        if record.kind == "adapter_loaded" and record.adapter_id not in adapter_seq:
            adapter_seq[cast(str, record.adapter_id)] = next_adapter
            new_adapters.append(index)
            next_adapter += 1
        if record.entry_id not in existing:
            entry_seq[record.entry_id] = next_entry
            new_rows.append(index)
            next_entry += 1
    seqs = np.array([entry_seq[record.entry_id] for record in records], dtype=np.int64)

    if new_rows:
        chosen = [records[i] for i in new_rows]

        def column(values: list[Any]) -> np.ndarray:
            return np.array(values, dtype=object)

        frame = {
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
        with store._registered(frame) as view:
            store._con.execute(
                f"INSERT INTO provenance SELECT entry_id, episode_id, action_type, content, content_hash, parent_id, "
                f"ts, 0, 0, active_adapter_id, seq, nullif(parent_seq, -1), nullif(adapter_seq, -1), score, "
                f"record_hash, ?, line_no FROM {view}",
                [incident.incident_id],
            )
        if vectors is not None:
            blobs = column([vectors[i].tobytes() for i in new_rows])
            with store._registered({"seq": seqs[new_rows], "vector": blobs}) as view:
                store._con.execute(f"INSERT INTO embeddings SELECT seq, vector FROM {view}")
            if store.embedding_dim is None:
                store._set_meta("embedding_dim", str(vectors.shape[1]))
                store._set_meta("embedder", embedder or "unknown")
        store._append_event(
            "ingested", "entry", seqs[new_rows], {"incident_id": incident.incident_id, "sha256": incident.sha256}
        )
    # scores of entries that were already present: raise, never lower
    present = [i for i, r in enumerate(records) if r.entry_id in existing]
    if present:
        with store._registered({"seq": seqs[present], "score": scores[present]}) as view:
            raised = store._con.execute(
                f"UPDATE provenance SET contamination_score = v.score FROM {view} v "
                f"WHERE provenance.seq = v.seq AND v.score > coalesce(provenance.contamination_score, 0) "
                f"RETURNING provenance.seq"
            ).fetchnumpy()["seq"]
        if len(raised):
            store._append_event(
                "contamination_scored", "entry", np.asarray(raised), {"incident_id": incident.incident_id}
            )
    # adapter lifecycle
    loaded_seqs = []
    for index in new_adapters:
        record = records[index]
        seq = adapter_seq[cast(str, record.adapter_id)]
        store._con.execute(
            "INSERT INTO adapter_provenance (adapter_id, adapter_name, adapter_hash, source, loaded_at, "
            "parent_adapter_id, episode_id, seq, influence, load_entry_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                record.adapter_id,
                record.adapter_name,
                record.adapter_hash,
                record.source,
                record.timestamp,
                record.parent_adapter_id,
                record.episode_id,
                seq,
                record.influence,
                record.entry_id,
            ],
        )
        loaded_seqs.append(seq)
    if loaded_seqs:
        store._append_event("adapter_loaded", "adapter", loaded_seqs, {"incident_id": incident.incident_id})
    for kind, column_name, event in (
        ("adapter_unloaded", "unloaded_at", "adapter_unloaded"),
        ("adapter_fused", "fused", "adapter_fused"),
    ):
        changed: list[int] = []
        for index in new_rows:
            record = records[index]
            if record.kind != kind:
                continue
            seq = adapter_seq[cast(str, record.adapter_id)]
            if column_name == "unloaded_at":
                hit = store._con.execute(
                    "UPDATE adapter_provenance SET unloaded_at = ? WHERE seq = ? AND unloaded_at IS NULL RETURNING seq",
                    [record.timestamp, seq],
                ).fetchall()
            else:
                hit = store._con.execute(
                    "UPDATE adapter_provenance SET fused = 1 WHERE seq = ? AND fused = 0 RETURNING seq", [seq]
                ).fetchall()
            changed.extend(int(row[0]) for row in hit)
        if changed:
            store._append_event(event, "adapter", changed, {"incident_id": incident.incident_id})
    known = store._one("SELECT count(*) FROM incidents WHERE incident_id = ?", [incident.incident_id])[0]
    if not known:
        store._con.execute(
            "INSERT INTO incidents VALUES (?, ?, ?, ?, ?)",
            [incident.incident_id, incident.sha256, incident.path, len(records), now],
        )
    return IngestResult(incident.incident_id, len(new_rows), len(records) - len(new_rows), len(new_adapters), seqs)


def bulk_load(
    store: DuckDBProvenanceStore,
    *,
    entry_ids: np.ndarray,
    parent_seq: np.ndarray,
    adapter_seq: np.ndarray,
    contamination: np.ndarray,
    adapter_ids: np.ndarray,
    influence: np.ndarray,
    vectors: np.ndarray | None = None,
    episode_ids: np.ndarray | None = None,
) -> None:
    """Load a synthetic graph into an empty store in one statement per table (benchmarks, migrations).

    Skips per-record validation (the caller vouches for ids being unique and parents coming first)
    but records one ``ingested`` event like a normal ingest.
    """
    if store.entry_count:
        raise StoreError("bulk_load needs an empty store")
    n = int(parent_seq.size)
    seqs = np.arange(n, dtype=np.int64)
    with store.transaction():
        frame = {
            "entry_id": entry_ids,
            "seq": seqs,
            "parent_seq": np.asarray(parent_seq, dtype=np.int64),
            "adapter_seq": np.asarray(adapter_seq, dtype=np.int64),
            "score": np.asarray(contamination, dtype=np.float64),
            "episode_id": episode_ids if episode_ids is not None else np.full(n, "bulk", dtype=object),
        }
        with store._registered(frame) as view:
            store._con.execute(
                f"INSERT INTO provenance SELECT v.entry_id, v.episode_id, 'tool_output', 'entry ' || v.entry_id, "
                f"sha256('entry ' || v.entry_id), NULL, v.seq, 0, 0, NULL, v.seq, nullif(v.parent_seq, -1), "
                f"nullif(v.adapter_seq, -1), v.score, NULL, 'bulk', NULL FROM {view} v"
            )
        with store._registered(
            {
                "adapter_id": adapter_ids,
                "seq": np.arange(adapter_ids.size, dtype=np.int64),
                "influence": np.asarray(influence, dtype=np.float64),
            }
        ) as view:
            store._con.execute(
                f"INSERT INTO adapter_provenance (adapter_id, adapter_name, adapter_hash, seq, influence) "
                f"SELECT adapter_id, adapter_id, sha256(adapter_id), seq, influence FROM {view}"
            )
        store._con.execute(
            "UPDATE provenance SET parent_id = p.entry_id FROM provenance p WHERE provenance.parent_seq = p.seq"
        )
        store._con.execute(
            "UPDATE provenance SET active_adapter_id = a.adapter_id FROM adapter_provenance a "
            "WHERE provenance.adapter_seq = a.seq"
        )
        if vectors is not None:
            vectors = np.ascontiguousarray(vectors, dtype=np.float32)
            blobs = np.empty(n, dtype=object)
            blobs[:] = [row.tobytes() for row in vectors]
            with store._registered({"seq": seqs, "vector": blobs}) as view:
                store._con.execute(f"INSERT INTO embeddings SELECT seq, vector FROM {view}")
            store._set_meta("embedding_dim", str(vectors.shape[1]))
            store._set_meta("embedder", "bulk")
        store._append_event("ingested", "entry", [], {"bulk": True, "entries": n})
