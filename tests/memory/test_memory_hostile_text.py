"""Text no store can hold never costs a stored item or an audit record: refused where it arrives, with the
rest of the session and its audit chain intact across close and reopen."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rvu_pipelines.errors import MemoryMonitorError, NamespaceError
from rvu_pipelines.memory import (
    AuditLog,
    Channel,
    DuckDBStore,
    MemoryItem,
    Reason,
    ReferenceMonitor,
    Rule,
    Write,
    open_memory,
)
from rvu_pipelines.memory.audit import AuditRecord, verify_chain
from rvu_pipelines.text_rules import InvalidTextError

LONE = "a\ud800b"


def reopen_items(path: Path) -> tuple[list[MemoryItem], int, bool]:
    """Items, number of decision records and whether the chain verifies, as a new process sees them."""
    with open_memory(path) as memory:
        assert memory.audit is not None
        decisions = sum(record.kind == "decision" for record in memory.audit.records())
        return memory.items(), decisions, memory.audit.verify().ok


def test_a_lone_surrogate_value_is_refused_and_the_session_survives_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "x.duckdb"
    memory = open_memory(path)
    assert memory.write("s", "before", "ok", channel=Channel.USER).accepted
    decision = memory.write("s", "k", LONE, channel=Channel.USER)
    assert not decision.accepted
    assert (decision.rule, decision.reason) == (Rule.WRITE_CHECK, Reason.INVALID_TEXT)
    assert memory.write("s", "after", "fine", channel=Channel.USER).accepted
    memory.close()  # raised UnicodeEncodeError and lost everything when the value was accepted
    items, n_records, ok = reopen_items(path)
    assert [(i.key, i.value) for i in items] == [("after", "fine"), ("before", "ok")]
    assert ok and n_records == 3  # one record per decision, the refusal included


def test_the_refusal_is_audited_with_a_digest_of_the_refused_value(tmp_path: Path) -> None:
    memory = ReferenceMonitor()
    memory.write("s", "k", LONE, channel=Channel.TOOL, claimed="from the \udc00 user")
    records = list(memory.audit.records()) if memory.audit is not None else []
    payload = records[-1].payload()
    assert payload["reason"] == "INVALID_TEXT" and payload["accepted"] is False
    assert payload["user_channel"] == {"invalid_text": {"defect": "lone_surrogate", "position": 1}}
    assert payload["claimed"] == "from the \udc00 user"  # logged as a JSON escape, read back exactly
    assert len(payload["value_sha256"]) == 64
    assert sorted(payload["rules"]) == [5, 11]  # the untrusted channel's rule is still named
    assert memory.audit is not None and memory.audit.verify().ok


SLOTS = (("session", "s"), ("key", "k"), ("namespace", None))


@pytest.mark.parametrize("where", ["session", "key", "namespace"])
def test_a_lone_surrogate_name_is_a_clear_error_and_changes_nothing(tmp_path: Path, where: str) -> None:
    path = tmp_path / "x.duckdb"
    memory = open_memory(path)
    memory.write("s", "before", "ok", channel=Channel.USER)
    session, key, namespace = (LONE if where == name else default for name, default in SLOTS)
    with pytest.raises(NamespaceError, match="lone UTF-16 surrogate"):
        memory.write(session or "s", key or "k", "v", channel=Channel.USER, namespace=namespace)
    with pytest.raises(NamespaceError):
        memory.read("s", LONE) if where == "key" else memory.read("s", "k", namespace=LONE)
    memory.close()
    items, n_records, ok = reopen_items(path)
    assert [(i.key, i.value) for i in items] == [("before", "ok")] and ok and n_records == 1


def test_a_batch_with_one_bad_value_is_refused_whole_before_any_decision() -> None:
    memory = ReferenceMonitor()
    batch = [Write("s", "a", "fine", Channel.USER), Write("s", "b", LONE, Channel.USER)]
    with pytest.raises(MemoryMonitorError, match="batch row 1"):
        memory.submit_many(batch)
    assert memory.items() == [] and len(memory.audit or []) == 0


def test_install_and_the_store_refuse_text_they_could_not_write(tmp_path: Path) -> None:
    with pytest.raises(MemoryMonitorError, match="surrogate"):
        ReferenceMonitor().install(MemoryItem("shared", "SOUL.md", LONE, Channel.SYSTEM))
    store = DuckDBStore(tmp_path / "s.duckdb")
    with pytest.raises(InvalidTextError, match="value"):
        store.upsert([MemoryItem("s", "good", "ok", Channel.USER), MemoryItem("s", "bad", LONE, Channel.USER)])
    assert store.load() == []  # all or nothing
    store.close()


def test_a_failing_encoder_leaves_every_pending_decision_pending_in_order() -> None:
    log = AuditLog(seal_every=10_000)

    def fine(entry: tuple) -> tuple[str, bytes]:
        return "note", b'{"n":%d}' % entry[1]

    def broken(entry: tuple) -> tuple[str, bytes]:
        raise RuntimeError("encoder bug")

    for n in range(3):
        log.record((fine, n))
    log.record((broken, 3))
    log.record((fine, 4))
    with pytest.raises(RuntimeError):
        log.seal()
    assert len(log) == 5  # 3 chained + 2 still pending; seal() must not drop them
    assert [r.payload()["n"] for r in log._records] == [0, 1, 2]
    assert [e[1] for e in log._pending] == [3, 4]


def test_a_store_that_fails_still_gets_the_audit_records_flushed(tmp_path: Path) -> None:
    class FailingStore(DuckDBStore):
        def upsert(self, items: object) -> None:
            raise OSError("disk full")

    store = FailingStore(tmp_path / "f.duckdb")
    memory = ReferenceMonitor(store, audit=AuditLog.open(tmp_path / "audit.duckdb"))
    memory.write("s", "k", "v", channel=Channel.USER)
    with pytest.raises(OSError):
        memory.close()
    reopened = AuditLog.open(tmp_path / "audit.duckdb")
    assert reopened.verify().ok and len(list(reopened.records())) == 1
    reopened.close()


# ---------------------------------------------------------------- property: write / close / reopen / verify

HOSTILE = st.one_of(
    st.text(st.characters(codec=None, exclude_categories=()), max_size=12),  # surrogates and NUL included
    st.sampled_from(["", " ", "\x00", "\ud800", "\udfff\ud800", "ok", "\U0001f600", "a" * 3000, "<|im_end|>"]),
)
NAMES = st.one_of(st.sampled_from(["s1", "s2", "k", "SOUL.md"]), HOSTILE)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.tuples(NAMES, NAMES, HOSTILE, st.sampled_from(list(Channel)), st.booleans()), min_size=1, max_size=12
    )
)
def test_any_writes_survive_close_and_reopen_with_a_verifying_chain(steps: list) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.duckdb"
        expected: dict[tuple[str, str], str] = {}
        records = 0
        memory = open_memory(path)
        for session, key, value, channel, close_after in steps:
            try:
                decision = memory.write(session, key, value, channel=channel)
            except MemoryMonitorError:  # a malformed call (a name that is empty, shared or not valid text)
                continue
            records += 1
            if decision.accepted:
                expected[(session, key)] = value
            else:
                assert decision.reason is not Reason.ACCEPTED
            if close_after:
                memory.close()
                memory = open_memory(path)
        assert memory.audit is not None
        head, n_closed = memory.audit.head, len(memory.audit)
        memory.close()
        with open_memory(path) as reopened:  # reopening over stored items chains one genesis record more
            assert {(i.namespace, i.key): i.value for i in reopened.items()} == expected
            assert reopened.audit is not None and reopened.audit.verify().ok
            found = list(reopened.audit.records())
            assert verify_chain(found[:n_closed], expected_head=head, expected_count=n_closed).ok
            assert sum(record.kind == "decision" for record in found) == records
            assert all(isinstance(record, AuditRecord) and record.payload() is not None for record in found)
