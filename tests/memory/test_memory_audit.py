"""The audit log is append-only and hash-chained: every decision is in it, and one altered,
dropped or reordered record makes verification fail (in memory and in DuckDB)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rvu_pipelines.errors import AuditIntegrityError
from rvu_pipelines.memory import AuditLog, AuditRecord, Channel, DuckDBAuditSink, ReferenceMonitor, Write, verify_chain
from rvu_pipelines.memory.audit import GENESIS_PREV, record_hash


def _exercise(m: ReferenceMonitor) -> None:
    web = m.observe("alice", Channel.WEB, "payload")
    m.write("alice", "notes.md", "tea", channel=Channel.USER)
    m.write("alice", "notes.md", "evil", channel=Channel.WEB, deps=[web], claimed="SYSTEM")
    m.read("alice", "secret", namespace="bob")
    m.promote("alice", "notes.md", authorizer=Channel.USER)
    m.internal("alice", "tool call")


def test_every_decision_accepted_and_rejected_is_recorded_and_chain_verifies(monitor: ReferenceMonitor) -> None:
    _exercise(monitor)
    records = list(monitor.audit.records())
    decisions = [r.payload() for r in records if r.kind == "decision"]
    assert [(d["op"], d["accepted"], d["rule"]) for d in decisions] == [
        ("WRITE", True, 2),
        ("WRITE", False, 4),
        ("READ", False, 9),
        ("PROMOTE", True, 6),
        ("INTERNAL", True, 0),
    ]
    evil = decisions[1]
    assert evil["claimed"] == "SYSTEM" and evil["channel"] == "WEB" and evil["rules"] == [4, 5]
    assert evil["value_sha256"] and "evil" not in str(evil)  # content is committed to by hash only
    assert {r.kind for r in records} >= {"genesis", "belief", "decision"}
    result = monitor.audit.verify()
    assert result.ok and result.n_records == len(records) and result.head == monitor.audit.head


@pytest.mark.parametrize("mutation", ["body", "drop", "swap", "rehash-one"])
def test_any_tampering_with_one_record_fails_verification(monitor: ReferenceMonitor, mutation: str) -> None:
    _exercise(monitor)
    records = list(monitor.audit.records())
    head = monitor.audit.head
    # the record of the rejected WEB write: rewriting history to say it was accepted
    i = next(k for k, rec in enumerate(records) if rec.kind == "decision" and rec.payload()["channel"] == "WEB")
    r = records[i]
    if mutation == "body":
        code = r.payload()["code"]
        forged = r.body.replace(b"[%d," % code, b"[%d," % (code | 1), 1)
        assert forged != r.body
        tampered = records[:i] + [r._replace(body=forged)] + records[i + 1 :]
    elif mutation == "drop":
        tampered = records[:i] + records[i + 1 :]
    elif mutation == "swap":
        tampered = records[:i] + [records[i + 1], records[i]] + records[i + 2 :]
    else:  # attacker recomputes the altered record's own hash: the next record's link still breaks
        body = r.body + b" "
        tampered = (
            records[:i]
            + [AuditRecord(r.seq, r.kind, body, r.prev, record_hash(r.seq, r.kind, r.prev, body))]
            + records[i + 1 :]
        )
    assert tampered != records
    result = verify_chain(tampered, expected_head=head)
    assert not result.ok
    assert result.first_bad_seq is not None and result.first_bad_seq <= i + 1
    with pytest.raises(AuditIntegrityError):
        result.raise_if_failed()
    assert verify_chain(records, expected_head=head).ok


def test_truncated_tail_is_caught_with_the_expected_head(monitor: ReferenceMonitor) -> None:
    _exercise(monitor)
    records = list(monitor.audit.records())
    assert not verify_chain(records[:-1], expected_head=monitor.audit.head).ok
    assert verify_chain(records[:-1]).ok  # without an anchor a chain cannot know its own end


def test_duckdb_audit_persists_resumes_and_detects_an_sql_edit(tmp_path: Path) -> None:
    path = tmp_path / "audit.duckdb"
    log = AuditLog.open(path, seal_every=2)
    m = ReferenceMonitor(audit=log)
    _exercise(m)
    m.flush()
    head, n = log.head, len(log)
    log.close()
    reopened = AuditLog.open(path)
    assert reopened.head == head and len(reopened) == n and reopened.verify(expected_head=head).ok
    m2 = ReferenceMonitor(audit=reopened)  # the chain continues after a restart
    m2.internal("carol")
    m2.flush()
    assert reopened.verify().ok and len(reopened) == n + 1  # an empty store adds no genesis record
    sink = reopened.sink
    assert isinstance(sink, DuckDBAuditSink)
    original = sink.connection.execute(f"SELECT body FROM {sink.TABLE} WHERE seq = 3").fetchall()[0][0]
    sink.connection.execute(f"UPDATE {sink.TABLE} SET body = ? WHERE seq = 3", [bytes(original) + b" "])
    result = reopened.verify()
    assert not result.ok and result.first_bad_seq == 3


def test_a_batch_is_one_record_over_all_its_decisions(monitor: ReferenceMonitor) -> None:
    batch = monitor.encode([Write("alice", f"k{i}", "v", Channel.USER if i % 2 else Channel.WEB) for i in range(10)])
    out = monitor.submit_batch(batch)
    rec = [r for r in monitor.audit.records() if r.kind == "batch"][-1]
    arrays = rec.arrays()
    assert np.array_equal(arrays["code"], out.codes) and rec.payload()["n"] == 10
    assert rec.payload()["values_sha256"]
    names = [r for r in monitor.audit.records() if r.kind == "names"]
    assert names and "k9" in names[-1].payload()["keys"]
    records = list(monitor.audit.records())
    i = records.index(rec)
    body = bytearray(rec.body)
    body[-5] ^= 1  # flip one bit in the node/code arrays
    tampered = records[:i] + [rec._replace(body=bytes(body))] + records[i + 1 :]
    assert not verify_chain(tampered).ok


def test_chain_starts_at_genesis_prev() -> None:
    log = AuditLog()
    first = log.append("note", {"x": 1})
    assert first.prev == GENESIS_PREV and first.seq == 0 and bool(AuditLog())


def test_durability_mode_is_explicit_and_flush_on_seal_persists_every_seal(tmp_path: Path) -> None:
    assert AuditLog().durability.startswith("in-memory")
    on_flush = AuditLog.open(tmp_path / "a.duckdb")
    assert on_flush.durability.startswith("persisted on flush()")
    sink = DuckDBAuditSink(tmp_path / "b.duckdb")
    log = AuditLog(sink, seal_every=4, flush_on_seal=True)
    assert log.durability.startswith("persisted every 4 decisions")
    m = ReferenceMonitor(audit=log)
    for i in range(9):  # 9 decisions: two seals of 4 reach the sink before any flush(); 1 is pending
        m.internal("alice", f"step {i}")
    assert len(list(sink.iter_records())) == 8 and len(log) == 9
    m.write("alice", "k", "v", channel=Channel.USER)
    m.flush()
    assert len(list(sink.iter_records())) == 10 and log.verify().ok
    log.append("note", {"x": 1})  # a JSON record is written at once too
    assert len(list(sink.iter_records())) == 11 and log.verify().ok
