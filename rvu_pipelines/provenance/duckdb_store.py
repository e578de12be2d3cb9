"""The DuckDB provenance store: one file holding what the agent did and every recovery decision.

It implements :class:`rvu_pipelines.provenance.store.ProvenanceStore`; all of its SQL lives here, the bulk
write paths included: an incident's new rows (:class:`SqlProvenanceStore.ingest` decides them), raised scores,
and a synthetic graph (``bulk_load``). The class is one unit because every method shares one connection, its
transaction depth and its temporary-view helpers.

Tables (seed 000 §3.2, plus what recovery at scale needs):

- ``provenance``: one row per entry, with the paper's columns (``active_adapter_id`` included) and an
  integer ``seq`` (dense, 0..n-1, in ingest order) plus ``parent_seq``/``adapter_seq``, so the graph
  loads as two integer arrays instead of strings;
- ``adapter_provenance``: adapter lifecycle (loaded/unloaded/fused, tainted, purged = evicted);
- ``quarantine``: reversible isolation (``restored`` = 1 once lifted);
- ``events``: an append-only, hash-chained log of every state change (``verify_event_chain``);
- ``embeddings``: each entry's vector, so the FAISS index is a cache the store can always rebuild;
- ``incidents`` and ``meta``.

The store is the source of truth. Writes happen in transactions; a failed write leaves nothing.
The tables carry no PRIMARY KEY/UNIQUE constraints on purpose: DuckDB rewrites a row of an indexed
table as delete + insert, which made a 300k-row tier update take 20 s instead of 0.1 s. Uniqueness
of entry and adapter ids is enforced by :meth:`DuckDBProvenanceStore.ingest`, the only writer of new rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from rvu_pipelines.errors import EntryNotFoundError, StoreError
from rvu_pipelines.provenance.closure import ProvenanceGraph
from rvu_pipelines.provenance.incident import IncidentLog
from rvu_pipelines.provenance.ingest_plan import IngestPlan, StoredEntry, SyntheticGraph
from rvu_pipelines.provenance.intsets import unique_ints
from rvu_pipelines.provenance.sql_store import SqlProvenanceStore

SCHEMA_VERSION = "1"

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key VARCHAR NOT NULL, value VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS provenance (
    entry_id            VARCHAR NOT NULL,
    episode_id          VARCHAR,
    action_type         VARCHAR,
    content             VARCHAR,
    content_hash        VARCHAR,
    parent_id           VARCHAR,
    "timestamp"         DOUBLE,
    tainted             INTEGER DEFAULT 0,
    purged              INTEGER DEFAULT 0,
    active_adapter_id   VARCHAR DEFAULT NULL,
    seq                 BIGINT NOT NULL,
    parent_seq          BIGINT,
    adapter_seq         BIGINT,
    contamination_score DOUBLE DEFAULT 0.0,
    record_hash         VARCHAR,
    incident_id         VARCHAR,
    line_no             INTEGER
);
CREATE TABLE IF NOT EXISTS adapter_provenance (
    adapter_id        VARCHAR NOT NULL,
    adapter_name      VARCHAR NOT NULL,
    adapter_hash      VARCHAR NOT NULL,
    source            VARCHAR DEFAULT 'local',
    loaded_at         DOUBLE,
    unloaded_at       DOUBLE,
    fused             INTEGER DEFAULT 0,
    risk_score        DOUBLE DEFAULT 0.0,
    tainted           INTEGER DEFAULT 0,
    purged            INTEGER DEFAULT 0,
    parent_adapter_id VARCHAR,
    episode_id        VARCHAR,
    seq               BIGINT NOT NULL,
    influence         DOUBLE,
    load_entry_id     VARCHAR
);
CREATE TABLE IF NOT EXISTS quarantine (
    entry_id       VARCHAR NOT NULL,
    quarantined_at DOUBLE,
    risk_score     DOUBLE,
    reason         VARCHAR,
    restored       INTEGER DEFAULT 0,
    seq            BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    seq           BIGINT NOT NULL,
    kind          VARCHAR NOT NULL,
    subject_type  VARCHAR NOT NULL,
    subjects      VARCHAR NOT NULL,
    details       VARCHAR NOT NULL,
    created_at_us BIGINT NOT NULL,
    prev_hash     VARCHAR NOT NULL,
    hash          VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS embeddings (seq BIGINT NOT NULL, vector BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS incidents (
    incident_id VARCHAR NOT NULL,
    sha256      VARCHAR NOT NULL,
    path        VARCHAR,
    entries     BIGINT,
    ingested_at DOUBLE
);
"""


class DuckDBProvenanceStore(SqlProvenanceStore):
    """A :class:`ProvenanceStore` over one DuckDB file (``":memory:"`` for throwaway stores); the behaviour both
    engines share is :class:`SqlProvenanceStore`, this class adds DuckDB's connection, views and bulk paths."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: str, read_only: bool) -> None:
        self._con = connection
        self.path = path
        self.read_only = read_only
        self._depth = 0
        self._temp = 0

    # ---------------------------------------------------------------- lifecycle

    @classmethod
    def open(cls, path: Path | str, *, read_only: bool = False, lock_timeout_s: float = 30.0) -> DuckDBProvenanceStore:
        """Open (creating if needed) the store at ``path``; waits up to ``lock_timeout_s`` for a lock."""
        target = str(path)
        if target != ":memory:":
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            if read_only and not Path(target).exists():
                raise StoreError(f"Provenance store {target} does not exist.")
        deadline = time.monotonic() + lock_timeout_s
        while True:
            try:
                connection = duckdb.connect(target, read_only=read_only)
                break
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or time.monotonic() >= deadline:
                    raise StoreError(f"Cannot open provenance store {target}: {exc}") from exc
                time.sleep(0.2)
        connection.execute("SET enable_progress_bar = false")
        store = cls(connection, target, read_only)
        if not read_only:
            store._create_schema()
        return store

    def _create_schema(self) -> None:
        with self.transaction():
            self._con.execute(_DDL)
            if self._meta("schema_version") is None:
                self._con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [SCHEMA_VERSION])
        self._check_schema_version(SCHEMA_VERSION)

    @contextlib.contextmanager
    def _outer_transaction(self) -> Iterator[None]:
        self._con.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                self._con.execute("ROLLBACK")
            raise
        self._con.execute("COMMIT")

    @contextlib.contextmanager
    def _registered(self, columns: Mapping[str, np.ndarray]) -> Iterator[str]:
        """Expose numpy columns to SQL as a temporary view (for set-based updates and joins)."""
        self._temp += 1
        name = f"_rvu_tmp_{self._temp}"
        self._con.register(name, dict(columns))
        try:
            yield name
        finally:
            with contextlib.suppress(Exception):
                self._con.unregister(name)

    def _rows(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        """Every row of a query (DuckDB refuses new work until a result is read to the end)."""
        return self._con.execute(sql, params or []).fetchall()

    def _select_by_seq(self, columns: str, table: str, seqs: np.ndarray) -> list[tuple]:
        with self._registered({"seq": seqs}) as view:
            return self._rows(f"SELECT {columns} FROM {table} JOIN {view} USING (seq)")

    def _stored_entries(self, entry_ids: Sequence[str]) -> dict[str, StoredEntry]:
        if not entry_ids:
            return {}
        with self._registered({"entry_id": np.array(list(entry_ids), dtype=object)}) as view:
            rows = self._rows(
                "SELECT p.entry_id, p.seq, p.record_hash, p.incident_id "
                f"FROM provenance p JOIN {view} v USING (entry_id)"
            )
        return {row[0]: StoredEntry(int(row[1]), row[2], row[3]) for row in rows}

    def _write_new_entries(
        self, incident: IncidentLog, plan: IngestPlan, vectors: np.ndarray | None, embedder: str | None
    ) -> None:
        """The plan's new provenance rows (and vectors) in one INSERT ... SELECT each, from registered numpy views."""
        with self._registered(plan.entry_columns) as view:
            self._con.execute(
                f"INSERT INTO provenance SELECT entry_id, episode_id, action_type, content, content_hash, parent_id, "
                f"ts, 0, 0, active_adapter_id, seq, nullif(parent_seq, -1), nullif(adapter_seq, -1), score, "
                f"record_hash, ?, line_no FROM {view}",
                [incident.incident_id],
            )
        if vectors is not None:
            blobs = np.array([vectors[i].tobytes() for i in plan.new_rows], dtype=object)
            with self._registered({"seq": plan.seqs[plan.new_rows], "vector": blobs}) as view:
                self._con.execute(f"INSERT INTO embeddings SELECT seq, vector FROM {view}")
            if self.embedding_dim is None:
                self._set_meta("embedding_dim", str(vectors.shape[1]))
                self._set_meta("embedder", embedder or "unknown")

    def _raise_scores(self, plan: IngestPlan) -> list[int]:
        with self._registered({"seq": plan.seqs[plan.present], "score": plan.scores[plan.present]}) as view:
            raised = self._con.execute(
                f"UPDATE provenance SET contamination_score = v.score FROM {view} v "
                f"WHERE provenance.seq = v.seq AND v.score > coalesce(provenance.contamination_score, 0) "
                f"RETURNING provenance.seq"
            ).fetchnumpy()["seq"]
        return [int(seq) for seq in np.asarray(raised).tolist()]

    def _set_meta(self, key: str, value: str) -> None:
        with self.transaction():
            self._con.execute("DELETE FROM meta WHERE key = ?", [key])
            self._con.execute("INSERT INTO meta VALUES (?, ?)", [key, value])

    # ---------------------------------------------------------------- counts and lookups

    def graph(self) -> ProvenanceGraph:
        """The provenance DAG as integer arrays (one query, no strings)."""
        arrays = self._con.execute(
            "SELECT seq, coalesce(parent_seq, -1) AS parent, coalesce(adapter_seq, -1) AS adapter FROM provenance"
        ).fetchnumpy()
        return ProvenanceGraph(
            parent=self._by_seq(arrays["seq"], arrays["parent"], np.int64),
            adapter=self._by_seq(arrays["seq"], arrays["adapter"], np.int64),
            n_adapters=self.adapter_count,
        )

    @staticmethod
    def _by_seq(seqs: np.ndarray, values: np.ndarray, dtype: type) -> np.ndarray:
        """Scatter a column into seq order (cheaper than ORDER BY on a million rows)."""
        seqs = np.asarray(seqs, dtype=np.int64)
        out: np.ndarray = np.empty(seqs.size, dtype=dtype)
        out[seqs] = np.asarray(values, dtype=dtype)
        return out

    def contamination_scores(self) -> np.ndarray:
        """P(contaminated | e) of every entry, indexed by seq."""
        arrays = self._con.execute("SELECT seq, coalesce(contamination_score, 0.0) AS p FROM provenance").fetchnumpy()
        return self._by_seq(arrays["seq"], arrays["p"], np.float64)

    def adapter_influence(self) -> np.ndarray:
        """The influence recorded for each adapter (0 where none), indexed by adapter seq."""
        values = self._con.execute(
            "SELECT coalesce(influence, 0.0) AS i FROM adapter_provenance ORDER BY seq"
        ).fetchnumpy()["i"]
        return np.asarray(values, dtype=np.float64)

    def seqs_of(self, entry_ids: Sequence[str]) -> np.ndarray:
        """seq of each entry id, in the given order; raises EntryNotFoundError for an unknown id."""
        if not len(entry_ids):
            return np.zeros(0, dtype=np.int64)
        ids = np.array(list(entry_ids), dtype=object)
        with self._registered({"entry_id": ids}) as view:
            rows = self._con.execute(
                f"SELECT p.entry_id, p.seq FROM provenance p JOIN {view} v USING (entry_id)"
            ).fetchall()
        found = dict(rows)
        missing = [entry_id for entry_id in entry_ids if entry_id not in found]
        if missing:
            raise EntryNotFoundError(f"Unknown entry id(s) in {self.path}: {', '.join(missing[:10])}")
        return np.array([found[entry_id] for entry_id in entry_ids], dtype=np.int64)

    def entry_ids(self, seqs: Sequence[int] | np.ndarray) -> list[str]:
        """Entry ids for the given seqs, in the given order."""
        seqs = np.asarray(seqs, dtype=np.int64)
        if seqs.size == 0:
            return []
        if seqs.size > 100_000:
            column = self._con.execute("SELECT entry_id FROM provenance ORDER BY seq").fetchnumpy()["entry_id"]
            return [str(value) for value in np.asarray(column, dtype=object)[seqs]]
        with self._registered({"seq": unique_ints(seqs)}) as view:
            rows = self._con.execute(f"SELECT p.seq, p.entry_id FROM provenance p JOIN {view} v USING (seq)").fetchall()
        found = dict(rows)
        return [found[int(seq)] for seq in seqs.tolist()]

    def entry_states(self, seqs: np.ndarray) -> dict[str, np.ndarray]:
        """tainted / quarantined (active) / purged flags for the given seqs, in the given order; raises
        EntryNotFoundError for a seq the store does not hold (as the PostgreSQL store does)."""
        seqs = np.asarray(seqs, dtype=np.int64)
        if seqs.size == 0:
            empty = np.zeros(0, dtype=bool)
            return {"tainted": empty, "quarantined": empty, "purged": empty}
        with self._registered({"seq": seqs, "pos": np.arange(seqs.size)}) as view:
            arrays = self._con.execute(
                f"SELECT v.pos, p.tainted, p.purged, (q.seq IS NOT NULL) AS quarantined FROM {view} v "
                f"JOIN provenance p ON p.seq = v.seq "
                f"LEFT JOIN (SELECT DISTINCT seq FROM quarantine WHERE restored = 0) q ON q.seq = v.seq ORDER BY v.pos"
            ).fetchnumpy()
        if len(arrays["pos"]) != seqs.size:
            raise EntryNotFoundError(f"Unknown entry seq(s) in {self.path}")
        return {
            "tainted": np.asarray(arrays["tainted"]) == 1,
            "quarantined": np.asarray(arrays["quarantined"], dtype=bool),
            "purged": np.asarray(arrays["purged"]) == 1,
        }

    def _bulk_load(self, graph: SyntheticGraph) -> None:
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
        adapter_ids, influence, vectors, episode_ids = (
            graph.adapter_ids,
            graph.influence,
            graph.vectors,
            graph.episode_ids,
        )
        n = graph.n
        seqs = np.arange(n, dtype=np.int64)
        with self.transaction():
            frame = {
                "entry_id": entry_ids,
                "seq": seqs,
                "parent_seq": np.asarray(parent_seq, dtype=np.int64),
                "adapter_seq": np.asarray(adapter_seq, dtype=np.int64),
                "score": np.asarray(contamination, dtype=np.float64),
                "episode_id": episode_ids if episode_ids is not None else np.full(n, "bulk", dtype=object),
            }
            with self._registered(frame) as view:
                self._con.execute(
                    f"INSERT INTO provenance SELECT v.entry_id, v.episode_id, 'tool_output', 'entry ' || v.entry_id, "
                    f"sha256('entry ' || v.entry_id), NULL, v.seq, 0, 0, NULL, v.seq, nullif(v.parent_seq, -1), "
                    f"nullif(v.adapter_seq, -1), v.score, NULL, 'bulk', NULL FROM {view} v"
                )
            with self._registered(
                {
                    "adapter_id": adapter_ids,
                    "seq": np.arange(adapter_ids.size, dtype=np.int64),
                    "influence": np.asarray(influence, dtype=np.float64),
                }
            ) as view:
                self._con.execute(
                    f"INSERT INTO adapter_provenance (adapter_id, adapter_name, adapter_hash, seq, influence) "
                    f"SELECT adapter_id, adapter_id, sha256(adapter_id), seq, influence FROM {view}"
                )
            self._con.execute(
                "UPDATE provenance SET parent_id = p.entry_id FROM provenance p WHERE provenance.parent_seq = p.seq"
            )
            self._con.execute(
                "UPDATE provenance SET active_adapter_id = a.adapter_id FROM adapter_provenance a "
                "WHERE provenance.adapter_seq = a.seq"
            )
            if vectors is not None:
                vectors = np.ascontiguousarray(vectors, dtype=np.float32)
                blobs = np.empty(n, dtype=object)
                blobs[:] = [row.tobytes() for row in vectors]
                with self._registered({"seq": seqs, "vector": blobs}) as view:
                    self._con.execute(f"INSERT INTO embeddings SELECT seq, vector FROM {view}")
                self._set_meta("embedding_dim", str(vectors.shape[1]))
                self._set_meta("embedder", "bulk")
            self._append_event("ingested", "entry", [], {"bulk": True, "entries": n})

    def _update_where(
        self, table: str, seqs: np.ndarray, condition: str, assignment: str, params: Sequence[Any] = ()
    ) -> np.ndarray:
        """Apply ``assignment`` to rows of ``seqs`` meeting ``condition``; return their seqs (sorted).

        Selecting first and updating second is ~30x faster in DuckDB than ``UPDATE ... RETURNING``.
        """
        with self._registered({"seq": seqs}) as view:
            changed = self._con.execute(
                f"SELECT seq FROM {table} WHERE seq IN (SELECT seq FROM {view}) AND {condition}"
            ).fetchnumpy()["seq"]
        changed = np.sort(np.asarray(changed, dtype=np.int64))
        if changed.size:
            with self._registered({"seq": changed}) as view:
                self._con.execute(
                    f"UPDATE {table} SET {assignment} WHERE seq IN (SELECT seq FROM {view})", list(params)
                ).fetchall()
        return changed

    def quarantine(
        self, seqs: np.ndarray | Sequence[int], risk: np.ndarray | Sequence[float], details: Mapping[str, Any]
    ) -> np.ndarray:
        """Quarantine entries that are neither purged nor already under an active quarantine."""
        seqs = np.asarray(seqs, dtype=np.int64)
        risk = np.asarray(risk, dtype=np.float64)
        if seqs.size == 0:
            return seqs
        now = time.time()
        reason = str(details.get("reason", "froc"))
        with self.transaction(), self._registered({"seq": seqs, "risk": risk}) as view:
            changed = self._con.execute(
                f"SELECT v.seq FROM {view} v JOIN provenance p ON p.seq = v.seq WHERE p.purged = 0 "
                f"AND NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.seq = v.seq AND q.restored = 0) ORDER BY v.seq"
            ).fetchnumpy()["seq"]
            changed = np.asarray(changed, dtype=np.int64)
            if changed.size:
                with self._registered({"seq": changed}) as pick:
                    self._con.execute(f"DELETE FROM quarantine WHERE seq IN (SELECT seq FROM {pick})")
                    self._con.execute(
                        f"INSERT INTO quarantine SELECT p.entry_id, ?, v.risk, ?, 0, v.seq FROM {view} v "
                        f"JOIN provenance p ON p.seq = v.seq WHERE v.seq IN (SELECT seq FROM {pick})",
                        [now, reason],
                    )
                self._append_event("quarantined", "entry", changed, details)
        return changed

    # ---------------------------------------------------------------- vectors

    def allowed_vector_seqs(self) -> np.ndarray:
        """Entries whose vector may be in the retrieval index: not purged, not under active quarantine."""
        n = self.entry_count
        allowed = np.zeros(n, dtype=bool)
        allowed[np.asarray(self._con.execute("SELECT seq FROM embeddings").fetchnumpy()["seq"], dtype=np.int64)] = True
        purged = np.asarray(
            self._con.execute("SELECT seq FROM provenance WHERE purged = 1").fetchnumpy()["seq"], dtype=np.int64
        )
        quarantined = np.asarray(
            self._con.execute("SELECT seq FROM quarantine WHERE restored = 0").fetchnumpy()["seq"], dtype=np.int64
        )
        allowed[purged] = False
        allowed[quarantined] = False
        return np.flatnonzero(allowed).astype(np.int64)

    def has_vector(self, seq: int) -> bool:
        return bool(self._one("SELECT count(*) FROM embeddings WHERE seq = ?", [int(seq)])[0])

    def vectors(self, seqs: np.ndarray | Sequence[int]) -> np.ndarray:
        """Stored vectors for the given seqs (float32 rows, in the given order)."""
        seqs = np.asarray(seqs, dtype=np.int64)
        dim = self.embedding_dim
        if seqs.size == 0 or dim is None:
            return np.zeros((0, dim or 0), dtype=np.float32)
        with self._registered({"seq": seqs, "pos": np.arange(seqs.size)}) as view:
            rows = self._con.execute(
                f"SELECT v.pos, e.vector FROM {view} v JOIN embeddings e ON e.seq = v.seq ORDER BY v.pos"
            ).fetchall()
        if len(rows) != seqs.size:
            raise StoreError("some entries have no stored vector")
        return np.stack([np.frombuffer(row[1], dtype=np.float32) for row in rows]).reshape(seqs.size, dim)

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> duckdb.DuckDBPyConnection:
        """Raw SQL for inspecting the tables in DuckDB-specific tests and notebooks; not part of
        :class:`ProvenanceStore`, and never used by recovery (writes here bypass the event log; don't)."""
        return self._con.execute(sql, params or [])
