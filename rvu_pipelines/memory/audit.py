"""Append-only, hash-chained audit log of every monitor decision (§9.5 "audit logs").

Each record commits to its predecessor: ``hash = sha256(seq | kind | prev | body)``, so changing,
dropping or reordering any record breaks ``verify()`` from that record on. The hot path only
appends a tuple to a pending list; records are serialised and chained in batches (``seal``), so a
single decision costs well under a microsecond here and the chain is still over every decision.
A batch of decisions is one record whose body holds the raw code arrays: one sha256 covers them all.

The chain alone cannot detect a truncated tail after a restart; keep ``head`` somewhere else (an
MLflow run, a certificate) and pass it to ``verify(expected_head=...)`` to close that gap.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring as _json_str  # C-accelerated JSON string quoting
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from rvu_pipelines.errors import AuditIntegrityError
from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.memory.model import Channel, NodeKind, decision_of
from rvu_pipelines.text_rules import digest_bytes, escape_lone_surrogates

GENESIS_PREV = "0" * 64


def _json_utf8(text: str) -> bytes:
    """JSON text as UTF-8; a lone surrogate (only possible inside a string literal) is written as its JSON
    escape, so a record about a value no store can hold can still be chained and read back."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return escape_lone_surrogates(text).encode()


def canonical_json(payload: Mapping[str, Any]) -> bytes:
    """Sorted keys, no whitespace: the byte form that is hashed, so it must be deterministic."""
    return _json_utf8(json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def record_hash(seq: int, kind: str, prev: str, body: bytes) -> str:
    return sha256_bytes(b"%d\x1f%b\x1f%b\x1f%b" % (seq, kind.encode(), prev.encode(), body))


class AuditRecord(NamedTuple):
    """One chained record; ``body`` is canonical JSON, or JSON header + newline + raw arrays."""

    seq: int
    kind: str
    body: bytes
    prev: str
    hash: str

    def payload(self) -> dict[str, Any]:
        """The JSON part as a dict (array records: the header; decisions: named fields)."""
        head, _, _ = self.body.partition(b"\n")
        data = json.loads(head)
        if self.kind == "decision":
            return decode_decision(data)
        return data

    def arrays(self) -> dict[str, np.ndarray]:
        """The raw arrays of a batch record, by name (empty for JSON records)."""
        head, sep, blob = self.body.partition(b"\n")
        if not sep:
            return {}
        out: dict[str, np.ndarray] = {}
        offset = 0
        for name, dtype, length in json.loads(head).get("arrays", []):
            dt = np.dtype(dtype)
            size = dt.itemsize * int(length)
            out[name] = np.frombuffer(blob, dtype=dt, count=int(length), offset=offset)
            offset += size
        return out


DECISION_FIELDS = (
    "code",
    "session",
    "namespace",
    "key",
    "channel",
    "claimed",
    "deps",
    "value_sha256",
    "node",
    "user_channel",
)


def decode_decision(row: list[Any]) -> dict[str, Any]:
    """Name the fields of a decision record and spell out its packed code (op, rule, reason)."""
    out = dict(zip(DECISION_FIELDS, row, strict=True))  # encode_decision writes exactly these fields
    d = decision_of(out["code"])
    out.update(
        op=d.op.name, accepted=d.accepted, rule=int(d.rule), reason=d.reason.name, rules=sorted(int(r) for r in d.rules)
    )
    if out["channel"] is not None:
        out["channel"] = Channel(out["channel"]).name
    return out


# ---------------------------------------------------------------- audit encoders (run at seal time)


def value_digest(text: str) -> str:
    """The sha256 the audit stores for a value or a belief's content (UTF-8, lone surrogates kept)."""
    return sha256_bytes(digest_bytes(text))


def _value_digest(value: str | None) -> str | None:
    return None if value is None else value_digest(value)


def _q(text: str | None) -> str:
    return "null" if text is None else _json_str(text)


def encode_decision(e: tuple[Any, ...]) -> tuple[str, bytes]:
    """A decision as a positional JSON array (see audit.DECISION_FIELDS): cheap to build and hash."""
    _, _op, code, session, ns, key, channel, claimed, deps, value, node, extra = e
    text = "[{:d},{},{},{},{},{},[{}],{},{},{}]".format(
        code,
        _json_str(session),
        _q(ns),
        _q(key),
        "null" if channel is None else channel,
        _q(claimed),
        ",".join(map(str, deps)),
        "null" if value is None else f'"{sha256_bytes(value.encode("utf-8", "surrogatepass"))}"',
        "null" if node is None else node,
        "null" if extra is None else canonical_json(extra).decode(),
    )
    try:
        return "decision", text.encode()
    except UnicodeEncodeError:  # a claim holding a lone surrogate: logged as its JSON escape
        return "decision", _json_utf8(text)


def encode_belief(e: tuple[Any, ...]) -> tuple[str, bytes]:
    """A belief-graph node as its audit record (kind, canonical JSON)."""
    _, node, kind, session, channel, content, parents, tainted = e
    return "belief", canonical_json(
        {
            "node": node,
            "kind": NodeKind(kind).name,
            "session": session,
            "channel": None if channel is None else Channel(channel).name,
            "content_sha256": _value_digest(content),
            "parents": list(parents),
            "tainted": bool(tainted),
        }
    )


def encode_context_reset(e: tuple[Any, ...]) -> tuple[str, bytes]:
    """A session's context reset as its audit record."""
    return "context_reset", canonical_json({"session": e[1]})


@dataclass(frozen=True)
class AuditVerification:
    """Outcome of an end-to-end chain check; ``first_bad_seq`` names the first broken record."""

    ok: bool
    n_records: int
    head: str
    first_bad_seq: int | None = None
    problem: str = ""

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise AuditIntegrityError(
                f"Audit log does not verify at record {self.first_bad_seq}: {self.problem}. "
                "Treat every decision from that record on as untrusted and restore the log from a copy."
            )


def verify_chain(
    records: Iterable[AuditRecord], expected_head: str | None = None, expected_count: int | None = None
) -> AuditVerification:
    """Recompute the chain from GENESIS_PREV; any edited, missing or reordered record fails it."""
    prev = GENESIS_PREV
    count = 0
    for expected_seq, record in enumerate(records):
        count = expected_seq + 1
        if record.seq != expected_seq:
            return AuditVerification(
                False, count, prev, expected_seq, f"sequence gap: found seq {record.seq}, expected {expected_seq}"
            )
        if record.prev != prev:
            return AuditVerification(False, count, prev, record.seq, "prev hash does not link to the previous record")
        actual = record_hash(record.seq, record.kind, record.prev, record.body)
        if actual != record.hash:
            return AuditVerification(False, count, prev, record.seq, "record content does not match its hash")
        prev = actual
    if expected_count is not None and count != expected_count:
        return AuditVerification(
            False, count, prev, count, f"log holds {count} records, expected {expected_count} (truncated?)"
        )
    if expected_head is not None and prev != expected_head:
        return AuditVerification(False, count, prev, count, "head hash differs from the expected head (truncated?)")
    return AuditVerification(True, count, prev)


class AuditSink(Protocol):
    """Where sealed records are persisted; rows are only ever inserted."""

    def write(self, records: Sequence[AuditRecord]) -> None: ...

    def iter_records(self) -> Iterator[AuditRecord]: ...

    def tail(self) -> tuple[int, str] | None: ...

    def close(self) -> None: ...


class DuckDBAuditSink:
    """Audit records in a DuckDB table (the same file as the memory store by default)."""

    TABLE = "memory_audit"

    def __init__(self, path: Path | str | None = None, *, connection: Any = None) -> None:
        import duckdb

        if connection is None:
            target = ":memory:" if path is None else str(path)
            if path is not None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            connection = duckdb.connect(target)
            self._owns = True
        else:
            self._owns = False
        self.connection = connection
        self.connection.execute(
            f"CREATE TABLE IF NOT EXISTS {self.TABLE} (seq BIGINT PRIMARY KEY, kind VARCHAR NOT NULL, "
            "prev VARCHAR NOT NULL, hash VARCHAR NOT NULL, body BLOB NOT NULL)"
        )

    def write(self, records: Sequence[AuditRecord]) -> None:
        if not records:
            return
        import polars as pl

        frame = pl.DataFrame(
            {
                "seq": pl.Series([r.seq for r in records], dtype=pl.Int64),
                "kind": [r.kind for r in records],
                "prev": [r.prev for r in records],
                "hash": [r.hash for r in records],
                "body": pl.Series([r.body for r in records], dtype=pl.Binary),
            }
        )
        self.connection.register("_rvu_audit_incoming", frame)
        try:
            self.connection.execute(
                f"INSERT INTO {self.TABLE} SELECT seq, kind, prev, hash, body FROM _rvu_audit_incoming"
            )
        finally:
            self.connection.unregister("_rvu_audit_incoming")

    def iter_records(self, chunk: int = 10_000) -> Iterator[AuditRecord]:
        cursor = self.connection.cursor()
        cursor.execute(f"SELECT seq, kind, body, prev, hash FROM {self.TABLE} ORDER BY seq")
        while rows := cursor.fetchmany(chunk):
            for seq, kind, body, prev, digest in rows:
                yield AuditRecord(int(seq), kind, bytes(body), prev, digest)
        cursor.close()

    def tail(self) -> tuple[int, str] | None:
        rows = self.connection.execute(f"SELECT seq, hash FROM {self.TABLE} ORDER BY seq DESC LIMIT 1").fetchall()
        if not rows:
            return None
        return int(rows[0][0]) + 1, rows[0][1]

    def close(self) -> None:
        if self._owns:
            self.connection.close()


# A pending entry is a tuple whose first element turns the tuple into (kind, body bytes) at seal time.
PendingEntry = tuple[Any, ...]
EntryEncoder = Callable[[PendingEntry], tuple[str, bytes]]


class AuditLog:
    """The hash chain; in memory, or persisted through an ``AuditSink`` on ``flush()``.

    Durability (``durability`` says which): without a sink every record lives in this process only;
    with a sink, records reach it at ``flush()``/``close()`` (the monitor's ``flush``), or at every
    seal with ``flush_on_seal=True``, so a crash loses at most the ``seal_every`` - 1 pending ones.
    """

    def __init__(self, sink: AuditSink | None = None, *, seal_every: int = 1024, flush_on_seal: bool = False) -> None:
        self.sink = sink
        self.seal_every = seal_every
        self.flush_on_seal = flush_on_seal
        self._pending: list[PendingEntry] = []
        self._records: list[AuditRecord] = []  # sealed, not yet written to the sink
        self._seq = 0
        self._head = GENESIS_PREV
        if sink is not None and (tail := sink.tail()) is not None:
            self._seq, self._head = tail

    @classmethod
    def open(cls, path: Path | str, **kwargs: Any) -> AuditLog:
        return cls(DuckDBAuditSink(path), **kwargs)

    @property
    def durability(self) -> str:
        """Where the chain survives a crash: 'in-memory', 'persisted on flush' or 'persisted every N'."""
        if self.sink is None:
            return "in-memory (lost at process exit)"
        sink = type(self.sink).__name__
        if self.flush_on_seal:
            return f"persisted every {self.seal_every} decisions ({sink}, flush on seal)"
        return f"persisted on flush()/close() ({sink})"

    # -- appending ---------------------------------------------------------------------------

    def record(self, entry: PendingEntry) -> None:
        """Hot path: remember the decision; it is chained at the next seal (every ``seal_every``, 1024 by default)."""
        pending = self._pending
        pending.append(entry)
        if len(pending) >= self.seal_every:
            self.seal()

    def append(self, kind: str, payload: Mapping[str, Any]) -> AuditRecord:
        """Chain a JSON record now (after every pending decision, so order is preserved)."""
        self.seal()
        record = self._chain(kind, canonical_json(payload))
        self._write_if_flush_on_seal()
        return record

    def append_arrays(self, kind: str, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> AuditRecord:
        """Chain a record of raw arrays (a whole batch of decisions under one sha256)."""
        self.seal()
        names = list(arrays)
        meta = dict(header)
        meta["arrays"] = [[name, arrays[name].dtype.str, int(arrays[name].shape[0])] for name in names]
        blob = b"".join(np.ascontiguousarray(arrays[name]).tobytes() for name in names)
        record = self._chain(kind, canonical_json(meta) + b"\n" + blob)
        self._write_if_flush_on_seal()
        return record

    def seal(self) -> int:
        """Serialise and chain every pending entry; returns how many were sealed.

        An entry leaves the pending list only once it is chained: if encoding one fails, it and every
        entry after it stay pending, in order, and the error propagates; no decision is dropped."""
        pending = self._pending
        if not pending:
            return 0
        self._pending = []
        chain = self._chain
        done = 0
        try:
            for entry in pending:
                chain(*entry[0](entry))
                done += 1
        except BaseException:
            self._pending = pending[done:] + self._pending
            raise
        self._write_if_flush_on_seal()
        return len(pending)

    def _write_if_flush_on_seal(self) -> None:
        if self.flush_on_seal and self.sink is not None and self._records:
            self.sink.write(self._records)
            self._records = []

    def _chain(self, kind: str, body: bytes) -> AuditRecord:
        seq = self._seq
        digest = record_hash(seq, kind, self._head, body)
        record = AuditRecord(seq, kind, body, self._head, digest)
        self._records.append(record)
        self._seq = seq + 1
        self._head = digest
        return record

    def flush(self) -> None:
        """Seal, then persist sealed records to the sink (kept in memory when there is none)."""
        self.seal()
        if self.sink is not None and self._records:
            self.sink.write(self._records)
            self._records = []

    # -- reading and verifying ---------------------------------------------------------------

    @property
    def head(self) -> str:
        self.seal()
        return self._head

    def __len__(self) -> int:
        return self._seq + len(self._pending)

    @property
    def sealed(self) -> int:
        """Records sealed into the chain so far (a seal moves it; pending records do not)."""
        return self._seq

    def __bool__(self) -> bool:  # an empty log is still a log
        return True

    def records(self) -> Iterator[AuditRecord]:
        """Every record, oldest first (from the sink, then the ones not yet flushed)."""
        self.seal()
        if self.sink is not None:
            yield from self.sink.iter_records()
        yield from list(self._records)

    def verify(self, expected_head: str | None = None) -> AuditVerification:
        """Re-hash the whole chain; also checks count and head against what this process wrote."""
        self.seal()
        result = verify_chain(self.records(), expected_count=self._seq)
        if result.ok and result.head != self._head:
            return AuditVerification(
                False,
                result.n_records,
                result.head,
                result.n_records,
                "stored head differs from the head this log wrote",
            )
        if result.ok and expected_head is not None and result.head != expected_head:
            return AuditVerification(
                False,
                result.n_records,
                result.head,
                result.n_records,
                "head hash differs from the expected head (truncated?)",
            )
        return result

    def close(self) -> None:
        self.flush()
        if self.sink is not None:
            self.sink.close()
