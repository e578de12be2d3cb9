"""The PostgreSQL provenance store: the same tables, rows and event chain as the DuckDB store, shared by workers.

It implements :class:`rvu_pipelines.provenance.store.ProvenanceStore` for the scale profile, where several
recovery workers (processes, machines) write one store. A location is a libpq URL; the store lives in one
schema of that database (``?schema=`` in the URL, default ``rvu``), so several stores can share a server.

Concurrency: every write transaction first takes a transaction-scoped advisory lock on the store's schema.
Writers therefore run one after another (the hash-chained event log is one sequence: two writers appending at
once would fork it), readers never wait, and a worker killed mid-transaction releases the lock with its
connection, leaving nothing half written. Row-level idempotency (``... WHERE tainted = 0 RETURNING seq``)
makes a retried step change nothing twice. Unlike the DuckDB tables these carry primary keys and unique
constraints: PostgreSQL updates indexed rows in place, and a second line of defence costs nothing here.

Bulk writes use ``COPY ... FROM STDIN``: an incident's new rows (:class:`SqlProvenanceStore.ingest` decides them)
and a synthetic graph (``bulk_load``, 10^6 entries in seconds). Large reads come back as one packed bytea per five
million rows, read by numpy, instead of a million Python tuples. PostgreSQL text cannot hold U+0000, so an
incident carrying one is refused before any write. The class is one unit, as the DuckDB store is: every method
shares one connection and its transaction depth.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from rvu_pipelines.errors import EntryNotFoundError, IncidentValidationError, StoreError
from rvu_pipelines.provenance.closure import ProvenanceGraph
from rvu_pipelines.provenance.incident import IncidentIssue, IncidentLog
from rvu_pipelines.provenance.ingest_plan import IngestPlan, StoredEntry, SyntheticGraph
from rvu_pipelines.provenance.postgres_location import redact, split_location
from rvu_pipelines.provenance.sql_store import SqlProvenanceStore

SCHEMA_VERSION = "1"
_CHUNK = 5_000_000  # seqs per packed read (24 bytes a row: 120 MB, far below the 1 GB bytea limit)

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS provenance (
    entry_id            TEXT NOT NULL UNIQUE,
    episode_id          TEXT,
    action_type         TEXT,
    content             TEXT,
    content_hash        TEXT,
    parent_id           TEXT,
    "timestamp"         DOUBLE PRECISION,
    tainted             INTEGER DEFAULT 0,
    purged              INTEGER DEFAULT 0,
    active_adapter_id   TEXT DEFAULT NULL,
    seq                 BIGINT PRIMARY KEY,
    parent_seq          BIGINT,
    adapter_seq         BIGINT,
    contamination_score DOUBLE PRECISION DEFAULT 0.0,
    record_hash         TEXT,
    incident_id         TEXT,
    line_no             INTEGER
);
CREATE TABLE IF NOT EXISTS adapter_provenance (
    adapter_id        TEXT NOT NULL UNIQUE,
    adapter_name      TEXT NOT NULL,
    adapter_hash      TEXT NOT NULL,
    source            TEXT DEFAULT 'local',
    loaded_at         DOUBLE PRECISION,
    unloaded_at       DOUBLE PRECISION,
    fused             INTEGER DEFAULT 0,
    risk_score        DOUBLE PRECISION DEFAULT 0.0,
    tainted           INTEGER DEFAULT 0,
    purged            INTEGER DEFAULT 0,
    parent_adapter_id TEXT,
    episode_id        TEXT,
    seq               BIGINT PRIMARY KEY,
    influence         DOUBLE PRECISION,
    load_entry_id     TEXT
);
CREATE TABLE IF NOT EXISTS quarantine (
    entry_id       TEXT NOT NULL,
    quarantined_at DOUBLE PRECISION,
    risk_score     DOUBLE PRECISION,
    reason         TEXT,
    restored       INTEGER DEFAULT 0,
    seq            BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS quarantine_seq ON quarantine (seq);
CREATE TABLE IF NOT EXISTS events (
    seq           BIGINT NOT NULL,
    kind          TEXT NOT NULL,
    subject_type  TEXT NOT NULL,
    subjects      TEXT NOT NULL,
    details       TEXT NOT NULL,
    created_at_us BIGINT NOT NULL,
    prev_hash     TEXT NOT NULL,
    hash          TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_seq ON events (seq);
CREATE TABLE IF NOT EXISTS embeddings (seq BIGINT PRIMARY KEY, vector BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS incidents (
    incident_id TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    path        TEXT,
    entries     BIGINT,
    ingested_at DOUBLE PRECISION
);
"""

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


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class PostgresProvenanceStore(SqlProvenanceStore):
    """A :class:`ProvenanceStore` in one schema of a PostgreSQL database (shared behaviour:
    :class:`SqlProvenanceStore`)."""

    _P = "%s"

    def __init__(self, connection: Any, path: str, schema: str, read_only: bool) -> None:
        self._con = connection
        self.path = path
        self.schema = schema
        self.read_only = read_only
        self._depth = 0
        self._lock_key = zlib.crc32(f"rvu-provenance:{schema}".encode())

    # ---------------------------------------------------------------- lifecycle

    @classmethod
    def open(
        cls, location: str, *, read_only: bool = False, connect_timeout_s: float = 30.0
    ) -> PostgresProvenanceStore:
        """Connect (retrying until ``connect_timeout_s`` while the server starts) and create the schema if needed."""
        import psycopg

        conninfo, schema = split_location(location)
        deadline = time.monotonic() + connect_timeout_s
        while True:
            try:
                connection = psycopg.connect(conninfo, autocommit=True, connect_timeout=5, application_name="rvu")
                break
            except psycopg.OperationalError as exc:
                if time.monotonic() >= deadline:
                    raise StoreError(f"Cannot connect to provenance store {redact(location)}: {exc}") from exc
                time.sleep(0.5)
        store = cls(connection, redact(location), schema, read_only)
        try:
            exists = connection.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema]).fetchone()
            if read_only:
                if exists is None:
                    raise StoreError(f"Provenance store {store.path} does not exist (no schema {schema!r}).")
                connection.execute(f"SET search_path TO {schema}")
                connection.execute("SET default_transaction_read_only = on")
            else:
                store._create_schema()
        except BaseException:
            store.close()
            raise
        return store

    def _create_schema(self) -> None:
        with self._con.transaction():
            self._con.execute("SELECT pg_advisory_xact_lock(%s)", [self._lock_key])
            self._con.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
            self._con.execute(f"SET search_path TO {self.schema}")
            self._con.execute(_DDL)
            self._con.execute(
                "INSERT INTO meta VALUES ('schema_version', %s) ON CONFLICT (key) DO NOTHING", [SCHEMA_VERSION]
            )
        self._check_schema_version(SCHEMA_VERSION)

    @contextlib.contextmanager
    def _outer_transaction(self) -> Iterator[None]:
        """Writers serialise on the store's advisory lock: held until commit or rollback, released by the server
        if the worker dies."""
        with self._connection_guard(), self._con.transaction():
            self._con.execute("SELECT pg_advisory_xact_lock(%s)", [self._lock_key])
            yield

    @contextlib.contextmanager
    def _connection_guard(self) -> Iterator[None]:
        """A lost server (crash, restart, network) becomes one clear StoreError instead of a driver traceback."""
        import psycopg

        try:
            yield
        except psycopg.OperationalError as exc:
            raise StoreError(
                f"Lost the connection to provenance store {self.path} ({str(exc).strip()}). The server rolls back "
                "an open transaction, so nothing of the interrupted step is in the store; once the server is back, "
                "run the same recovery again: it resumes from what was committed and signs the same certificate."
            ) from exc

    def _rows(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        if self._depth:  # inside a transaction: its guard reports a lost connection once
            return list(self._con.execute(sql, params).fetchall())
        with self._connection_guard():
            return list(self._con.execute(sql, params).fetchall())

    def _select_by_seq(self, columns: str, table: str, seqs: np.ndarray) -> list[tuple]:
        return self._rows(f"SELECT {columns} FROM {table} WHERE seq = ANY(%s)", [np.asarray(seqs).tolist()])

    def _stored_entries(self, entry_ids: Sequence[str]) -> dict[str, StoredEntry]:
        if not entry_ids:
            return {}
        rows = self._rows(
            "SELECT entry_id, seq, record_hash, incident_id FROM provenance WHERE entry_id = ANY(%s)", [list(entry_ids)]
        )
        return {row[0]: StoredEntry(int(row[1]), row[2], row[3]) for row in rows}

    def _check_incident(self, incident: IncidentLog) -> None:
        refuse_nul_characters(incident)

    def _write_new_entries(
        self, incident: IncidentLog, plan: IngestPlan, vectors: np.ndarray | None, embedder: str | None
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
        self._copy_rows(f"provenance ({_ENTRY_COLUMNS})", rows)
        if vectors is not None:
            seqs = plan.seqs[plan.new_rows].tolist()
            self._copy_rows(
                "embeddings (seq, vector)",
                ((s, vectors[i].tobytes()) for s, i in zip(seqs, plan.new_rows, strict=True)),
            )
            if self.embedding_dim is None:
                self._set_meta("embedding_dim", str(vectors.shape[1]))
                self._set_meta("embedder", embedder or "unknown")

    def _raise_scores(self, plan: IngestPlan) -> list[int]:
        raised = self._rows(
            "UPDATE provenance p SET contamination_score = v.score "
            "FROM unnest(%s::bigint[], %s::double precision[]) AS v(seq, score) "
            "WHERE p.seq = v.seq AND v.score > coalesce(p.contamination_score, 0) RETURNING p.seq",
            [plan.seqs[plan.present].tolist(), plan.scores[plan.present].tolist()],
        )
        return [int(row[0]) for row in raised]

    def _columns(self, table: str, expressions: Sequence[str], kinds: str) -> list[np.ndarray]:
        """Numeric columns of a whole table as numpy arrays: the server packs each chunk of rows into one bytea
        (``string_agg`` of ``int8send`` / ``float8send``, big-endian) and numpy reads it in one pass. Every
        expression must be a non-null ``bigint`` ("i") or ``double precision`` ("f"); rows come in any order.
        Faster than ``COPY``, which yields one message per row, and far faster than fetching tuples.
        Chunks of ``_CHUNK`` seqs keep each bytea far below PostgreSQL's 1 GB value limit."""
        packed = " || ".join(
            f"{'int8send' if kind == 'i' else 'float8send'}({expression})"
            for expression, kind in zip(expressions, kinds, strict=True)
        )
        dtype = np.dtype([(f"v{i}", ">i8" if kind == "i" else ">f8") for i, kind in enumerate(kinds)])
        top = int(self._one(f"SELECT coalesce(max(seq) + 1, 0) FROM {table}")[0])
        parts = []
        for start in range(0, top, _CHUNK):
            row = self._one(
                f"SELECT string_agg({packed}, ''::bytea) FROM {table} WHERE seq >= %s AND seq < %s",
                [start, start + _CHUNK],
            )
            if row[0] is not None:
                parts.append(np.frombuffer(row[0], dtype=dtype))
        rows = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
        return [rows[f"v{i}"].astype(np.int64 if kind == "i" else np.float64) for i, kind in enumerate(kinds)]

    @staticmethod
    def _by_seq(seqs: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Scatter a column into seq order (cheaper than ORDER BY on a million rows)."""
        out = np.empty(seqs.size, dtype=values.dtype)
        out[seqs] = values
        return out

    def _set_meta(self, key: str, value: str) -> None:
        with self.transaction():
            self._con.execute(
                "INSERT INTO meta VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value", [key, value]
            )

    # ---------------------------------------------------------------- counts and lookups

    def graph(self) -> ProvenanceGraph:
        seqs, parent, adapter = self._columns(
            "provenance", ["seq", "coalesce(parent_seq, -1)", "coalesce(adapter_seq, -1)"], "iii"
        )
        return ProvenanceGraph(
            parent=self._by_seq(seqs, parent), adapter=self._by_seq(seqs, adapter), n_adapters=self.adapter_count
        )

    def contamination_scores(self) -> np.ndarray:
        seqs, scores = self._columns("provenance", ["seq", "coalesce(contamination_score, 0.0)"], "if")
        return self._by_seq(seqs, scores)

    def adapter_influence(self) -> np.ndarray:
        rows = self._rows("SELECT coalesce(influence, 0.0) FROM adapter_provenance ORDER BY seq")
        return np.array([float(row[0]) for row in rows], dtype=np.float64)

    def seqs_of(self, entry_ids: Sequence[str]) -> np.ndarray:
        if not len(entry_ids):
            return np.zeros(0, dtype=np.int64)
        found = dict(self._rows("SELECT entry_id, seq FROM provenance WHERE entry_id = ANY(%s)", [list(entry_ids)]))
        missing = [entry_id for entry_id in entry_ids if entry_id not in found]
        if missing:
            raise EntryNotFoundError(f"Unknown entry id(s) in {self.path}: {', '.join(missing[:10])}")
        return np.array([found[entry_id] for entry_id in entry_ids], dtype=np.int64)

    def entry_states(self, seqs: np.ndarray) -> dict[str, np.ndarray]:
        seqs = np.asarray(seqs, dtype=np.int64)
        rows = self._rows(
            "SELECT v.pos, p.tainted, p.purged, EXISTS (SELECT 1 FROM quarantine q WHERE q.seq = v.seq AND "
            "q.restored = 0) FROM unnest(%s::bigint[]) WITH ORDINALITY AS v(seq, pos) "
            "JOIN provenance p ON p.seq = v.seq ORDER BY v.pos",
            [seqs.tolist()],
        )
        if len(rows) != seqs.size:
            raise EntryNotFoundError(f"Unknown entry seq(s) in {self.path}")
        return {
            "tainted": np.array([row[1] == 1 for row in rows], dtype=bool),
            "quarantined": np.array([bool(row[3]) for row in rows], dtype=bool),
            "purged": np.array([row[2] == 1 for row in rows], dtype=bool),
        }

    # ---------------------------------------------------------------- ingest

    def _bulk_load(self, graph: SyntheticGraph) -> None:
        """Load a synthetic graph into an empty store with ``COPY`` (benchmarks, migrations); one ``ingested``
        event. The caller vouches for unique ids and parents before children (the primary keys still check)."""
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
        with self.transaction():
            self._copy_csv(f"provenance ({_ENTRY_COLUMNS})", ordered)
            self._copy_rows(
                "adapter_provenance (adapter_id, adapter_name, adapter_hash, seq, influence)",
                (
                    (name, name, _sha256_text(name), seq, float(value))
                    for seq, (name, value) in enumerate(zip(adapter_names, np.asarray(influence).tolist(), strict=True))
                ),
            )
            if vectors is not None:
                vectors = np.ascontiguousarray(vectors, dtype=np.float32)
                self._copy_rows("embeddings (seq, vector)", ((i, vectors[i].tobytes()) for i in range(n)))
                self._set_meta("embedding_dim", str(vectors.shape[1]))
                self._set_meta("embedder", "bulk")
            self._append_event("ingested", "entry", [], {"bulk": True, "entries": n})

    def _copy_csv(self, target: str, frame: pl.DataFrame) -> None:
        """``COPY target FROM STDIN`` of a polars frame as CSV (nulls as unquoted empty fields)."""
        payload = frame.write_csv(include_header=False, null_value="", quote_style="non_numeric").encode()
        with self._con.cursor() as cursor, cursor.copy(f"COPY {target} FROM STDIN WITH (FORMAT csv)") as copy:
            for start in range(0, len(payload), 1 << 24):
                copy.write(payload[start : start + (1 << 24)])

    def _copy_rows(self, target: str, rows: Any) -> None:
        """``COPY target FROM STDIN``, one Python row at a time (exact types: bytea, nulls)."""
        with self._con.cursor() as cursor, cursor.copy(f"COPY {target} FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    # ---------------------------------------------------------------- tier state changes

    def _update_where(
        self, table: str, seqs: np.ndarray, condition: str, assignment: str, params: Sequence[Any] = ()
    ) -> np.ndarray:
        rows = self._rows(
            f"UPDATE {table} SET {assignment} WHERE seq = ANY(%s) AND {condition} RETURNING seq",
            [*params, seqs.tolist()],
        )
        return np.sort(np.array([int(row[0]) for row in rows], dtype=np.int64))

    def quarantine(
        self, seqs: np.ndarray | Sequence[int], risk: np.ndarray | Sequence[float], details: Mapping[str, Any]
    ) -> np.ndarray:
        seqs = np.asarray(seqs, dtype=np.int64)
        risk = np.asarray(risk, dtype=np.float64)
        if seqs.size == 0:
            return seqs
        reason = str(details.get("reason", "froc"))
        with self.transaction():
            changed = np.array(
                [
                    int(row[0])
                    for row in self._rows(
                        "SELECT DISTINCT v.seq FROM unnest(%s::bigint[]) AS v(seq) JOIN provenance p ON p.seq = v.seq "
                        "WHERE p.purged = 0 AND NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.seq = v.seq AND "
                        "q.restored = 0) ORDER BY v.seq",
                        [seqs.tolist()],
                    )
                ],
                dtype=np.int64,
            )
            if changed.size:
                self._con.execute("DELETE FROM quarantine WHERE seq = ANY(%s)", [changed.tolist()])
                self._con.execute(
                    "INSERT INTO quarantine SELECT p.entry_id, %s, v.risk, %s, 0, v.seq "
                    "FROM unnest(%s::bigint[], %s::double precision[]) AS v(seq, risk) "
                    "JOIN provenance p ON p.seq = v.seq WHERE v.seq = ANY(%s)",
                    [time.time(), reason, seqs.tolist(), risk.tolist(), changed.tolist()],
                )
                self._append_event("quarantined", "entry", changed, details)
        return changed

    # ---------------------------------------------------------------- vectors

    def allowed_vector_seqs(self) -> np.ndarray:
        rows = self._rows(
            "SELECT e.seq FROM embeddings e JOIN provenance p ON p.seq = e.seq WHERE p.purged = 0 AND NOT EXISTS "
            "(SELECT 1 FROM quarantine q WHERE q.seq = e.seq AND q.restored = 0) ORDER BY e.seq"
        )
        return np.array([int(row[0]) for row in rows], dtype=np.int64)

    def has_vector(self, seq: int) -> bool:
        return self._first("SELECT 1 FROM embeddings WHERE seq = %s", [int(seq)]) is not None

    def vectors(self, seqs: np.ndarray | Sequence[int]) -> np.ndarray:
        seqs = np.asarray(seqs, dtype=np.int64)
        dim = self.embedding_dim
        if seqs.size == 0 or dim is None:
            return np.zeros((0, dim or 0), dtype=np.float32)
        rows = self._rows(
            "SELECT e.vector FROM unnest(%s::bigint[]) WITH ORDINALITY AS v(seq, pos) "
            "JOIN embeddings e ON e.seq = v.seq ORDER BY v.pos",
            [seqs.tolist()],
        )
        if len(rows) != seqs.size:
            raise StoreError("some entries have no stored vector")
        return np.stack([np.frombuffer(bytes(row[0]), dtype=np.float32) for row in rows]).reshape(seqs.size, dim)

    # ---------------------------------------------------------------- event log

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        """Raw SQL for engine-specific tests and inspection; not part of :class:`ProvenanceStore`, never used by
        recovery (writes here bypass the event log; don't). Placeholders are ``%s``."""
        return self._con.execute(sql, params)
