"""The PostgreSQL store's bulk write paths, both through ``COPY``: an incident's new rows
(:class:`SqlProvenanceStore.ingest` decides them) and a synthetic graph (``bulk_load``); and what PostgreSQL
cannot store.

Split from :mod:`postgres_store` for length only, as :mod:`duckdb_ingest` is from the DuckDB store: these
functions take the store as their first argument and use its connection helpers.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from rvu_pipelines.errors import IncidentValidationError
from rvu_pipelines.provenance.incident import IncidentIssue, IncidentLog
from rvu_pipelines.provenance.ingest_plan import IngestPlan, SyntheticGraph

if TYPE_CHECKING:
    from rvu_pipelines.provenance.postgres_store import PostgresProvenanceStore

_ENTRY_COLUMNS = (
    'entry_id, episode_id, action_type, content, content_hash, parent_id, "timestamp", active_adapter_id, seq, '
    "parent_seq, adapter_seq, contamination_score, record_hash, incident_id, line_no"
)


_TEXT_FIELDS = (
    "entry_id",
    "episode_id",
    "action_type",
    "content",
    "parent_id",
    "active_adapter_id",
    "adapter_id",
    "adapter_name",
    "adapter_hash",
    "source",
    "parent_adapter_id",
)


def refuse_nul_characters(incident: IncidentLog) -> None:
    """PostgreSQL text cannot hold U+0000 (DuckDB can): refuse such an incident by line and field, before any write,
    rather than fail half-way with a driver error."""
    issues = [
        IncidentIssue(
            incident.path,
            record.line,
            name,
            "contains a NUL character (\\u0000), which a PostgreSQL store cannot hold; remove it, or recover into "
            "a DuckDB store",
        )
        for record in incident.records
        for name in _TEXT_FIELDS
        if "\x00" in (getattr(record, name) or "")
    ]
    if issues:
        raise IncidentValidationError(incident.path, issues)


def write_new_entries(
    store: PostgresProvenanceStore,
    incident: IncidentLog,
    plan: IngestPlan,
    vectors: np.ndarray | None,
    embedder: str | None,
) -> None:
    """The plan's new provenance rows (and vectors) through ``COPY ... FROM STDIN``."""
    columns = plan.entry_columns
    rows = zip(
        columns["entry_id"].tolist(),
        columns["episode_id"].tolist(),
        columns["action_type"].tolist(),
        columns["content"].tolist(),
        columns["content_hash"].tolist(),
        columns["parent_id"].tolist(),
        columns["ts"].tolist(),
        columns["active_adapter_id"].tolist(),
        columns["seq"].tolist(),
        [None if s < 0 else s for s in columns["parent_seq"].tolist()],
        [None if s < 0 else s for s in columns["adapter_seq"].tolist()],
        columns["score"].tolist(),
        columns["record_hash"].tolist(),
        [incident.incident_id] * len(plan.new_rows),
        columns["line_no"].tolist(),
        strict=True,
    )
    store._copy_rows(f"provenance ({_ENTRY_COLUMNS})", rows)
    if vectors is not None:
        seqs = plan.seqs[plan.new_rows].tolist()
        store._copy_rows(
            "embeddings (seq, vector)", ((s, vectors[i].tobytes()) for s, i in zip(seqs, plan.new_rows, strict=True))
        )
        if store.embedding_dim is None:
            store._set_meta("embedding_dim", str(vectors.shape[1]))
            store._set_meta("embedder", embedder or "unknown")


def bulk_load(store: PostgresProvenanceStore, graph: SyntheticGraph) -> None:
    """Load a synthetic graph into an empty store with ``COPY`` (benchmarks, migrations); one ``ingested``
    event. The caller vouches for unique ids and parents before children (the primary keys still check)."""
    entry_ids, parent_seq, adapter_seq, contamination = (
        graph.entry_ids,
        graph.parent_seq,
        graph.adapter_seq,
        graph.contamination,
    )
    adapter_ids, influence, vectors, episode_ids = graph.adapter_ids, graph.influence, graph.vectors, graph.episode_ids
    n = graph.n
    ids = np.asarray(entry_ids, dtype=object)
    names = np.asarray(adapter_ids, dtype=object)
    parents, adapters_of = np.asarray(parent_seq, dtype=np.int64), np.asarray(adapter_seq, dtype=np.int64)
    content = ["entry " + str(entry_id) for entry_id in ids.tolist()]
    ordered = pl.DataFrame(
        {
            "entry_id": ids.tolist(),
            "episode_id": ["bulk"] * n if episode_ids is None else np.asarray(episode_ids, dtype=object).tolist(),
            "action_type": ["tool_output"] * n,
            "content": content,
            "content_hash": [_sha256_text(text) for text in content],
            "parent_id": [None if p < 0 else ids[p] for p in parents.tolist()],
            "timestamp": np.arange(n, dtype=np.float64),
            "active_adapter_id": [None if a < 0 else names[a] for a in adapters_of.tolist()],
            "seq": np.arange(n, dtype=np.int64),
            "parent_seq": [None if p < 0 else p for p in parents.tolist()],
            "adapter_seq": [None if a < 0 else a for a in adapters_of.tolist()],
            "contamination_score": np.asarray(contamination, dtype=np.float64),
            "record_hash": [None] * n,
            "incident_id": ["bulk"] * n,
            "line_no": [None] * n,
        },
        schema_overrides={
            "parent_seq": pl.Int64,
            "adapter_seq": pl.Int64,
            "record_hash": pl.String,
            "line_no": pl.Int64,
            "parent_id": pl.String,
            "active_adapter_id": pl.String,
        },
    )
    adapter_names = names.tolist()
    with store.transaction():
        _copy_csv(store, f"provenance ({_ENTRY_COLUMNS})", ordered)
        store._copy_rows(
            "adapter_provenance (adapter_id, adapter_name, adapter_hash, seq, influence)",
            (
                (name, name, _sha256_text(name), seq, float(value))
                for seq, (name, value) in enumerate(zip(adapter_names, np.asarray(influence).tolist(), strict=True))
            ),
        )
        if vectors is not None:
            vectors = np.ascontiguousarray(vectors, dtype=np.float32)
            store._copy_rows("embeddings (seq, vector)", ((i, vectors[i].tobytes()) for i in range(n)))
            store._set_meta("embedding_dim", str(vectors.shape[1]))
            store._set_meta("embedder", "bulk")
        store._append_event("ingested", "entry", [], {"bulk": True, "entries": n})


def _copy_csv(store: PostgresProvenanceStore, target: str, frame: pl.DataFrame) -> None:
    """``COPY target FROM STDIN`` of a polars frame as CSV (nulls as unquoted empty fields)."""
    payload = frame.write_csv(include_header=False, null_value="", quote_style="non_numeric").encode()
    with store._con.cursor() as cursor, cursor.copy(f"COPY {target} FROM STDIN WITH (FORMAT csv)") as copy:
        for start in range(0, len(payload), 1 << 24):
            copy.write(payload[start : start + (1 << 24)])


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
