"""The engine-neutral half of the SQL provenance stores: what DuckDB and PostgreSQL do the same way.

State changes (taint, purge, evict, restore), the hash-chained event log, entry and adapter rows, and the
ingest sequence (ask the tables, apply :mod:`ingest_plan`'s rules, write) are written once here in plain,
portable SQL. Each engine supplies the few primitives that differ: its transaction, how a query with a set
of seqs runs (a registered numpy view in DuckDB, ``= ANY(array)`` in PostgreSQL), how new rows are bulk
written, and its parameter placeholder (``?`` vs ``%s``).
"""

from __future__ import annotations

import contextlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Self

import numpy as np

from rvu_pipelines.errors import EntryNotFoundError, RestoreError, StoreError
from rvu_pipelines.provenance import ingest_plan
from rvu_pipelines.provenance.canonical import canonical_dumps
from rvu_pipelines.provenance.events import EVENT_KINDS, GENESIS_HASH, event_hash, verify_chain
from rvu_pipelines.provenance.incident import IncidentLog
from rvu_pipelines.provenance.ingest_plan import IngestPlan, StoredAdapter, StoredEntry, SyntheticGraph
from rvu_pipelines.provenance.intsets import unique_ints
from rvu_pipelines.provenance.store import AdapterRow, ChainReport, EntryRow, Event, IngestResult, ManifestRow

_EVENT_COLUMNS = "seq, kind, subject_type, subjects, details, created_at_us, prev_hash, hash"
_ADAPTER_COLUMNS = (
    "seq, adapter_id, adapter_name, adapter_hash, source, loaded_at, unloaded_at, fused, tainted, purged, influence, "
    "episode_id, load_entry_id"
)


def as_seqs(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """Sorted unique int64 seqs (an empty int64 array for none)."""
    return unique_ints(values) if len(values) else np.zeros(0, dtype=np.int64)


class SqlProvenanceStore(ABC):
    """Shared :class:`ProvenanceStore` behaviour over an engine's primitives (the abstract methods below)."""

    path: str
    read_only: bool
    _con: Any  # the engine's connection
    _depth = 0  # transaction nesting
    _P = "?"  # the driver's parameter placeholder

    # ---------------------------------------------------------------- what an engine supplies

    @abstractmethod
    def _outer_transaction(self) -> AbstractContextManager[None]:
        """Begin; commit when the block ends, roll back if it raises (and take any write lock the engine needs)."""

    @abstractmethod
    def _rows(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]: ...

    @abstractmethod
    def _select_by_seq(self, columns: str, table: str, seqs: np.ndarray) -> list[tuple]:
        """``SELECT columns FROM table`` for the rows whose seq is in ``seqs`` (any order)."""

    @abstractmethod
    def _update_where(
        self, table: str, seqs: np.ndarray, condition: str, assignment: str, params: Sequence[Any] = ()
    ) -> np.ndarray:
        """Apply ``assignment`` to rows of ``seqs`` meeting ``condition``; return their seqs, sorted."""

    @abstractmethod
    def _stored_entries(self, entry_ids: Sequence[str]) -> dict[str, StoredEntry]: ...

    @abstractmethod
    def _write_new_entries(
        self, incident: IncidentLog, plan: IngestPlan, vectors: np.ndarray | None, embedder: str | None
    ) -> None:
        """Insert the plan's new provenance rows (and their vectors) in bulk."""

    @abstractmethod
    def _raise_scores(self, plan: IngestPlan) -> list[int]:
        """Raise (never lower) the stored P(contaminated) of the plan's present entries; the seqs that rose."""

    @abstractmethod
    def _bulk_load(self, graph: SyntheticGraph) -> None:
        """Write ``graph`` into this empty store in bulk, inside one transaction, with one ``ingested`` event."""

    def _check_incident(self, incident: IncidentLog) -> None:
        """What this engine cannot store, refused by line before any write (default: nothing)."""
        return None

    # ---------------------------------------------------------------- small helpers

    def _first(self, sql: str, params: Sequence[Any] | None = None) -> tuple | None:
        rows = self._rows(sql, params)
        return rows[0] if rows else None

    def _one(self, sql: str, params: Sequence[Any] | None = None) -> tuple:
        """The row of a query that always returns one (an aggregate such as count(*))."""
        row = self._first(sql, params)
        if row is None:
            raise RuntimeError(f"query returned no row: {sql}")
        return row

    def _sql(self, text: str) -> str:
        """Portable SQL written with ``?`` placeholders, in this driver's style."""
        return text if self._P == "?" else text.replace("?", self._P)

    def _meta(self, key: str) -> str | None:
        row = self._first(self._sql("SELECT value FROM meta WHERE key = ?"), [key])
        return None if row is None else str(row[0])

    def _next_seq(self, table: str) -> int:
        return int(self._one(f"SELECT coalesce(max(seq) + 1, 0) FROM {table}")[0])

    # ---------------------------------------------------------------- lifecycle

    def _check_schema_version(self, expected: str) -> None:
        version = self._meta("schema_version")
        if version != expected:
            raise StoreError(f"Provenance store {self.path} has schema version {version}; this code needs {expected}.")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._con.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """All writes inside happen or none do; nested uses join the outer transaction."""
        if self.read_only:
            raise StoreError(f"Provenance store {self.path} is open read-only.")
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        with self._outer_transaction():
            self._depth = 1
            try:
                yield
            finally:
                self._depth = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- reads

    @property
    def entry_count(self) -> int:
        return int(self._one("SELECT count(*) FROM provenance")[0])

    @property
    def adapter_count(self) -> int:
        return int(self._one("SELECT count(*) FROM adapter_provenance")[0])

    @property
    def embedding_dim(self) -> int | None:
        value = self._meta("embedding_dim")
        return None if value is None else int(value)

    @property
    def embedder_name(self) -> str | None:
        return self._meta("embedder")

    def incident_seqs(self, incident: IncidentLog) -> np.ndarray:
        return self.seqs_of(incident.entry_ids)  # type: ignore[attr-defined]

    def adapter_ids(self, seqs: Sequence[int] | np.ndarray) -> list[str]:
        rows = dict(self._rows("SELECT seq, adapter_id FROM adapter_provenance"))
        return [rows[int(seq)] for seq in np.asarray(seqs, dtype=np.int64).tolist()]

    def entry_ids(self, seqs: Sequence[int] | np.ndarray) -> list[str]:
        """Entry ids for the given seqs, in the given order."""
        seqs = np.asarray(seqs, dtype=np.int64)
        if seqs.size == 0:
            return []
        found = dict(self._select_by_seq("seq, entry_id", "provenance", unique_ints(seqs)))
        return [found[int(seq)] for seq in seqs.tolist()]

    def entry(self, entry_id: str) -> EntryRow:
        row = self._first(
            self._sql(
                "SELECT p.seq, p.entry_id, p.episode_id, p.action_type, p.content, p.content_hash, p.parent_id, "
                'p."timestamp", p.tainted, p.purged, p.active_adapter_id, p.contamination_score, '
                "EXISTS (SELECT 1 FROM quarantine q WHERE q.seq = p.seq AND q.restored = 0) "
                "FROM provenance p WHERE p.entry_id = ?"
            ),
            [entry_id],
        )
        if row is None:
            raise EntryNotFoundError(f"No entry {entry_id!r} in provenance store {self.path}.")
        return EntryRow(
            int(row[0]),
            row[1],
            row[2],
            row[3],
            row[4],
            row[5],
            row[6],
            float(row[7]),
            bool(row[8]),
            bool(row[9]),
            row[10],
            float(row[11] or 0.0),
            bool(row[12]),
        )

    def adapters(self, seqs: Sequence[int] | np.ndarray | None = None) -> list[AdapterRow]:
        """Adapter rows (all, or those with the given seqs), ordered by seq."""
        rows = self._rows(f"SELECT {_ADAPTER_COLUMNS} FROM adapter_provenance ORDER BY seq")
        wanted = None if seqs is None else set(np.asarray(seqs, dtype=np.int64).tolist())
        return [
            AdapterRow(
                int(r[0]),
                r[1],
                r[2],
                r[3],
                r[4],
                r[5],
                r[6],
                bool(r[7]),
                bool(r[8]),
                bool(r[9]),
                None if r[10] is None else float(r[10]),
                r[11],
                r[12],
            )
            for r in rows
            if wanted is None or int(r[0]) in wanted
        ]

    def manifest(self, seqs: Sequence[int] | np.ndarray) -> list[ManifestRow]:
        """Manifest rows of the given entry seqs, in the given order; EntryNotFoundError for an unknown seq."""
        seqs = np.asarray(seqs, dtype=np.int64)
        if seqs.size == 0:
            return []
        rows = self._select_by_seq(
            "seq, entry_id, content_hash, action_type, active_adapter_id", "provenance", unique_ints(seqs)
        )
        found = {int(row[0]): ManifestRow(int(row[0]), row[1], row[2], row[3], row[4]) for row in rows}
        missing = [seq for seq in seqs.tolist() if seq not in found]
        if missing:
            raise EntryNotFoundError(f"Unknown entry seq(s) in {self.path}: {missing[:10]}")
        return [found[seq] for seq in seqs.tolist()]

    # ---------------------------------------------------------------- ingest

    def bulk_load(
        self,
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
        """Load a synthetic graph into an empty store in bulk (benchmarks, migrations). Skips per-record
        validation (the caller vouches for unique ids and parents before children) but records one ``ingested``
        event like a normal ingest."""
        if self.entry_count:
            raise StoreError("bulk_load needs an empty store")
        graph = SyntheticGraph(
            entry_ids, parent_seq, adapter_seq, contamination, adapter_ids, influence, vectors, episode_ids
        )
        self._bulk_load(graph)

    def ingest(
        self,
        incident: IncidentLog,
        *,
        contamination: Mapping[str, float] | None = None,
        vectors: np.ndarray | None = None,
        embedder: str | None = None,
    ) -> IngestResult:
        """Write a validated incident: all of it, or (on any problem) nothing.

        Entries already in the store with the same record hash are skipped, so ingesting the same file twice
        changes nothing; an id already present with different content is an error (:mod:`ingest_plan`).
        ``contamination`` maps entry id -> P(contaminated) (raised, never lowered, on re-ingest); ``vectors``
        (one row per record, float32) are stored so the vector index can be rebuilt.
        """
        scores = ingest_plan.contamination_column(incident, contamination)
        with self.transaction():
            vectors = ingest_plan.checked_vectors(vectors, incident, self.embedding_dim, self.path, self.embedder_name)
            existing = self._stored_entries(incident.entry_ids)
            parents = self._stored_entries(list(incident.external_parents))
            adapters = {
                row[0]: StoredAdapter(int(row[1]), row[2])
                for row in self._rows("SELECT adapter_id, seq, load_entry_id FROM adapter_provenance")
            }
            ingest_plan.validate(incident, existing, parents, adapters)
            self._check_incident(incident)
            plan = ingest_plan.plan(
                incident,
                existing,
                parents,
                adapters,
                scores,
                self._next_seq("provenance"),
                self._next_seq("adapter_provenance"),
            )
            details = {"incident_id": incident.incident_id}
            if plan.new_rows:
                self._write_new_entries(incident, plan, vectors, embedder)
                self._append_event(
                    "ingested", "entry", plan.seqs[plan.new_rows], {**details, "sha256": incident.sha256}
                )
            raised = self._raise_scores(plan) if plan.present else []
            if raised:
                self._append_event("contamination_scored", "entry", sorted(raised), details)
            self._write_adapter_lifecycle(plan, details)
            if self._first(self._sql("SELECT 1 FROM incidents WHERE incident_id = ?"), [incident.incident_id]) is None:
                self._rows(
                    self._sql("INSERT INTO incidents VALUES (?, ?, ?, ?, ?) RETURNING incident_id"),
                    [incident.incident_id, incident.sha256, incident.path, len(incident.records), time.time()],
                )
        return IngestResult(
            incident.incident_id,
            len(plan.new_rows),
            len(incident.records) - len(plan.new_rows),
            len(plan.new_adapters),
            plan.seqs,
        )

    def _write_adapter_lifecycle(self, plan: IngestPlan, details: Mapping[str, Any]) -> None:
        """New adapters, then unloads and fusions (each only if it changes something), each kind one event; then
        one ``adapter_refused`` event per refusal line new to the store (the refused adapter has no row, so
        ``subjects`` is empty and the details name it)."""
        for adapter in plan.new_adapters:
            marks = ", ".join([self._P] * len(adapter))
            self._rows(
                f"INSERT INTO adapter_provenance ({', '.join(adapter)}) VALUES ({marks}) RETURNING seq",
                list(adapter.values()),
            )
        if plan.new_adapters:
            self._append_event("adapter_loaded", "adapter", [a["seq"] for a in plan.new_adapters], details)
        unload = self._sql("UPDATE adapter_provenance SET unloaded_at = ? WHERE seq = ? AND unloaded_at IS NULL")
        unloaded = [int(r[0]) for seq, ts in plan.unloads for r in self._rows(unload + " RETURNING seq", [ts, seq])]
        if unloaded:
            self._append_event("adapter_unloaded", "adapter", unloaded, details)
        fuse = self._sql("UPDATE adapter_provenance SET fused = 1 WHERE seq = ? AND fused = 0 RETURNING seq")
        fused = [int(r[0]) for seq in plan.fusions for r in self._rows(fuse, [seq])]
        if fused:
            self._append_event("adapter_fused", "adapter", fused, details)
        for refusal in plan.refusals:
            self._append_event("adapter_refused", "adapter", [], {**details, **refusal})

    # ---------------------------------------------------------------- tier state changes

    def _change(
        self,
        table: str,
        subject: str,
        kind: str,
        seqs: np.ndarray | Sequence[int],
        condition: str,
        assignment: str,
        details: Mapping[str, Any],
    ) -> np.ndarray:
        seqs = as_seqs(seqs)
        if seqs.size == 0:
            return seqs
        with self.transaction():
            changed = self._update_where(table, seqs, condition, assignment)
            if changed.size:
                self._append_event(kind, subject, changed, details)
        return changed

    def mark_tainted(self, seqs: np.ndarray | Sequence[int], details: Mapping[str, Any]) -> np.ndarray:
        """Set ``tainted`` on entries not yet tainted; returns (and logs) the seqs that changed."""
        return self._change("provenance", "entry", "tainted", seqs, "tainted = 0", "tainted = 1", details)

    def mark_adapters_tainted(self, adapter_seqs: np.ndarray | Sequence[int], details: Mapping[str, Any]) -> np.ndarray:
        return self._change(
            "adapter_provenance", "adapter", "tainted", adapter_seqs, "tainted = 0", "tainted = 1", details
        )

    def purge(self, seqs: np.ndarray | Sequence[int], details: Mapping[str, Any]) -> np.ndarray:
        """Mark entries purged (and tainted); irreversible. Returns the seqs that changed."""
        return self._change("provenance", "entry", "purged", seqs, "purged = 0", "purged = 1, tainted = 1", details)

    def evict_adapters(
        self, adapter_seqs: np.ndarray | Sequence[int], details: Mapping[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mark adapters evicted (purged + tainted) and unloaded. Returns (evicted, newly unloaded)."""
        adapter_seqs = as_seqs(adapter_seqs)
        empty = np.zeros(0, dtype=np.int64)
        if adapter_seqs.size == 0:
            return empty, empty
        with self.transaction():
            unloaded = self._update_where(
                "adapter_provenance", adapter_seqs, "unloaded_at IS NULL", f"unloaded_at = {self._P}", [time.time()]
            )
            evicted = self._update_where("adapter_provenance", adapter_seqs, "purged = 0", "purged = 1, tainted = 1")
            if unloaded.size:
                self._append_event("adapter_unloaded", "adapter", unloaded, {**details, "by": "eviction"})
            if evicted.size:
                self._append_event("evicted", "adapter", evicted, details)
        return evicted, unloaded

    def restore(self, entry_id: str, details: Mapping[str, Any] | None = None) -> bool:
        """Lift an active quarantine. False if there is none (already restored); RestoreError if impossible."""
        entry = self.entry(entry_id)
        if entry.purged:
            raise RestoreError(f"Entry {entry_id!r} is purged; a purge is irreversible and cannot be restored.")
        with self.transaction():
            lifted = self._rows(
                self._sql("UPDATE quarantine SET restored = 1 WHERE seq = ? AND restored = 0 RETURNING seq"),
                [entry.seq],
            )
            if not lifted:
                ever = self._one(self._sql("SELECT count(*) FROM quarantine WHERE seq = ?"), [entry.seq])[0]
                if not ever:
                    raise RestoreError(f"Entry {entry_id!r} was never quarantined; there is nothing to restore.")
                return False
            self._append_event("restored", "entry", [entry.seq], dict(details or {"reason": "operator"}))
        return True

    # ---------------------------------------------------------------- event log

    def record_gate_verdict(self, decision: Literal["admitted", "refused"], details: Mapping[str, Any]) -> None:
        """Log an adapter gate's verdict reached outside any incident (a runtime screening before it loads), so
        the chained log holds every refusal and admission, not only those an incident line reports."""
        if decision not in ("admitted", "refused"):
            raise ValueError(f"an adapter gate's decision is 'admitted' or 'refused', not {decision!r}")
        with self.transaction():
            self._append_event(f"adapter_{decision}", "adapter", [], details)

    def _append_event(
        self, kind: str, subject_type: str, subjects: Sequence[int] | np.ndarray, details: Mapping[str, Any]
    ) -> None:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        with self.transaction():  # nobody else appends between reading the head and inserting
            head = self._first("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
            seq = 0 if head is None else int(head[0]) + 1
            prev_hash = GENESIS_HASH if head is None else str(head[1])
            # canonical form of a list of ints, built directly: no per-element encoder call for a million subjects
            subjects_json = "[" + ",".join(map(str, np.asarray(subjects, dtype=np.int64).tolist())) + "]"
            details_json = canonical_dumps(dict(details))
            created = int(time.time() * 1_000_000)
            digest = event_hash(seq, kind, subject_type, subjects_json, details_json, created, prev_hash)
            self._rows(
                self._sql("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq"),
                [seq, kind, subject_type, subjects_json, details_json, created, prev_hash, digest],
            )

    def events(self, kind: str | None = None) -> list[Event]:
        query = f"SELECT {_EVENT_COLUMNS} FROM events"
        params: list[Any] = []
        if kind is not None:
            query += self._sql(" WHERE kind = ?")
            params.append(kind)
        rows = self._rows(query + " ORDER BY seq", params)
        return [Event(int(r[0]), r[1], r[2], json.loads(r[3]), json.loads(r[4]), int(r[5]), r[6], r[7]) for r in rows]

    def events_for_entry(self, entry_id: str) -> list[Event]:
        seq = self.entry(entry_id).seq
        return [event for event in self.events() if event.subject_type == "entry" and seq in event.subjects]

    def verify_event_chain(self) -> ChainReport:
        """Recompute every event hash and link; any edit, deletion or reordering breaks the chain."""
        return verify_chain(self._rows(f"SELECT {_EVENT_COLUMNS} FROM events ORDER BY seq"))
