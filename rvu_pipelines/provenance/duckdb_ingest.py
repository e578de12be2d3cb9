"""The DuckDB store's bulk write paths: an incident's new rows (:class:`SqlProvenanceStore.ingest` decides them),
raised scores, and a synthetic graph (``bulk_load``).

Split from :mod:`duckdb_store` for length only: these functions take the store as their first argument
and use its connection helpers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from rvu_pipelines.provenance.incident import IncidentLog
from rvu_pipelines.provenance.ingest_plan import IngestPlan, StoredEntry, SyntheticGraph

if TYPE_CHECKING:
    from rvu_pipelines.provenance.duckdb_store import DuckDBProvenanceStore


def stored_entries(store: DuckDBProvenanceStore, entry_ids: Sequence[str]) -> dict[str, StoredEntry]:
    if not entry_ids:
        return {}
    with store._registered({"entry_id": np.array(list(entry_ids), dtype=object)}) as view:
        rows = store._rows(
            f"SELECT p.entry_id, p.seq, p.record_hash, p.incident_id FROM provenance p JOIN {view} v USING (entry_id)"
        )
    return {row[0]: StoredEntry(int(row[1]), row[2], row[3]) for row in rows}


def write_new_entries(
    store: DuckDBProvenanceStore,
    incident: IncidentLog,
    plan: IngestPlan,
    vectors: np.ndarray | None,
    embedder: str | None,
) -> None:
    """The plan's new provenance rows (and vectors) in one INSERT ... SELECT each, from registered numpy views."""
    with store._registered(plan.entry_columns) as view:
        store._con.execute(
            f"INSERT INTO provenance SELECT entry_id, episode_id, action_type, content, content_hash, parent_id, "
            f"ts, 0, 0, active_adapter_id, seq, nullif(parent_seq, -1), nullif(adapter_seq, -1), score, "
            f"record_hash, ?, line_no FROM {view}",
            [incident.incident_id],
        )
    if vectors is not None:
        blobs = np.array([vectors[i].tobytes() for i in plan.new_rows], dtype=object)
        with store._registered({"seq": plan.seqs[plan.new_rows], "vector": blobs}) as view:
            store._con.execute(f"INSERT INTO embeddings SELECT seq, vector FROM {view}")
        if store.embedding_dim is None:
            store._set_meta("embedding_dim", str(vectors.shape[1]))
            store._set_meta("embedder", embedder or "unknown")


def raise_scores(store: DuckDBProvenanceStore, plan: IngestPlan) -> list[int]:
    with store._registered({"seq": plan.seqs[plan.present], "score": plan.scores[plan.present]}) as view:
        raised = store._con.execute(
            f"UPDATE provenance SET contamination_score = v.score FROM {view} v "
            f"WHERE provenance.seq = v.seq AND v.score > coalesce(provenance.contamination_score, 0) "
            f"RETURNING provenance.seq"
        ).fetchnumpy()["seq"]
    return [int(seq) for seq in np.asarray(raised).tolist()]


def bulk_load(store: DuckDBProvenanceStore, graph: SyntheticGraph) -> None:
    """Load a synthetic graph into an empty store in one statement per table (benchmarks, migrations).

    Skips per-record validation (the caller vouches for ids being unique and parents coming first)
    but records one ``ingested`` event like a normal ingest.
    """
    entry_ids, parent_seq, adapter_seq, contamination = (
        graph.entry_ids,
        graph.parent_seq,
        graph.adapter_seq,
        graph.contamination,
    )
    adapter_ids, influence, vectors, episode_ids = graph.adapter_ids, graph.influence, graph.vectors, graph.episode_ids
    n = graph.n
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
