"""The provenance store, on both engines (DuckDB file, PostgreSQL schema): ingest (idempotent, all-or-nothing),
state changes, the hash-chained log."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rvu_pipelines.errors import EntryNotFoundError, IncidentValidationError, RestoreError, StoreError
from rvu_pipelines.provenance import load_incident, open_store, write_incident
from rvu_pipelines.recovery.pipeline import ingest_incident
from rvu_pipelines.recovery.reproductions import e2_records


@pytest.fixture
def e2_store(tmp_path: Path, store_location: str):
    incident = load_incident(write_incident(e2_records(), tmp_path / "e2.jsonl"))
    store = open_store(store_location)
    ingest_incident(store, incident)
    yield store, incident
    store.close()


def test_seed_tables_and_columns_exist(e2_store) -> None:
    store, _ = e2_store
    tables = {row[0] for row in store.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert {"provenance", "adapter_provenance", "quarantine", "events"} <= tables
    columns = {
        row[0]
        for row in store.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'provenance'"
        ).fetchall()
    }
    assert {
        "entry_id",
        "episode_id",
        "action_type",
        "content",
        "content_hash",
        "parent_id",
        "timestamp",
        "tainted",
        "purged",
        "active_adapter_id",
    } <= columns


def test_ingest_records_entries_adapters_and_events(e2_store) -> None:
    store, incident = e2_store
    assert store.entry_count == 9 and store.adapter_count == 2
    b2 = store.entry("b2")
    assert b2.parent_id == "b1" and b2.active_adapter_id == "adapter-b" and not b2.tainted
    assert store.entry("b1").contamination_score == 1.0
    graph = store.graph()
    assert graph.parent[b2.seq] == store.entry("b1").seq
    assert [event.kind for event in store.events()] == ["ingested", "adapter_loaded"]
    assert store.verify_event_chain().ok
    assert store.embedding_dim == 64
    assert store.vectors([b2.seq]).shape == (1, 64)


def test_reingesting_the_same_incident_changes_nothing(e2_store) -> None:
    store, incident = e2_store
    events = len(store.events())
    result = ingest_incident(store, incident)[0]
    assert (result.new_entries, result.already_present) == (0, 9)
    assert store.entry_count == 9 and len(store.events()) == events


def test_conflicting_entry_is_refused_and_nothing_is_written(e2_store, tmp_path: Path) -> None:
    store, _ = e2_store
    records = e2_records()
    records[1]["content"] = "something else"
    records.append(
        {
            "kind": "action",
            "entry_id": "new-one",
            "episode_id": "ep",
            "timestamp": 1.0,
            "action_type": "tool_output",
            "content": "fresh",
        }
    )
    with pytest.raises(IncidentValidationError) as caught:
        ingest_incident(store, load_incident(write_incident(records, tmp_path / "conflict.jsonl")))
    assert [(i.line, i.field) for i in caught.value.issues] == [(2, "entry_id")]
    assert store.entry_count == 9
    with pytest.raises(EntryNotFoundError):
        store.entry("new-one")


def test_references_to_the_store_resolve_across_incidents(e2_store, tmp_path: Path) -> None:
    store, _ = e2_store
    follow_up = [
        {
            "kind": "action",
            "entry_id": "b4",
            "episode_id": "ep-e2b",
            "timestamp": 2.0,
            "action_type": "tool_output",
            "content": "more",
            "parent_id": "b3",
            "active_adapter_id": "adapter-b",
        }
    ]
    ingest_incident(store, load_incident(write_incident(follow_up, tmp_path / "next.jsonl")))
    assert store.entry("b4").parent_id == "b3"
    missing = [{**follow_up[0], "entry_id": "b5", "parent_id": "nope", "active_adapter_id": "ghost"}]
    with pytest.raises(IncidentValidationError) as caught:
        ingest_incident(store, load_incident(write_incident(missing, tmp_path / "bad.jsonl")))
    assert {i.field for i in caught.value.issues} == {"parent_id", "active_adapter_id"}


def test_state_changes_are_idempotent_and_logged_once(e2_store) -> None:
    store, _ = e2_store
    seqs = store.seqs_of(["b1", "b2"])
    assert store.mark_tainted(seqs, {"reason": "test"}).tolist() == sorted(seqs.tolist())
    assert store.mark_tainted(seqs, {"reason": "test"}).size == 0
    assert store.quarantine(seqs[:1], [0.7], {"reason": "test"}).size == 1
    assert store.quarantine(seqs[:1], [0.7], {"reason": "test"}).size == 0
    assert store.purge(seqs[1:], {"reason": "test"}).size == 1
    assert store.purge(seqs[1:], {"reason": "test"}).size == 0
    assert store.quarantine(seqs[1:], [0.7], {"reason": "test"}).size == 0  # purged beats quarantine
    evicted, unloaded = store.evict_adapters([1], {"reason": "test"})
    assert evicted.tolist() == [1] and unloaded.tolist() == [1]
    assert store.evict_adapters([1], {"reason": "test"})[0].size == 0
    kinds = [event.kind for event in store.events()][2:]
    assert kinds == ["tainted", "quarantined", "purged", "adapter_unloaded", "evicted"]
    assert store.verify_event_chain().ok


def test_restore_rules(e2_store) -> None:
    store, _ = e2_store
    a1, b1 = store.seqs_of(["a1", "b1"])
    store.quarantine([a1], [0.65], {"reason": "test"})
    assert store.entry("a1").quarantined
    assert store.restore("a1") is True
    assert not store.entry("a1").quarantined
    assert store.restore("a1") is False  # already lifted: no change, no event
    assert [e.kind for e in store.events_for_entry("a1")] == ["ingested", "quarantined", "restored"]
    store.quarantine([a1], [0.65], {"reason": "again"})  # re-quarantine after a restore works
    assert store.entry("a1").quarantined
    with pytest.raises(RestoreError, match="never quarantined"):
        store.restore("a2")
    store.purge([b1], {"reason": "test"})
    with pytest.raises(RestoreError, match="irreversible"):
        store.restore("b1")
    with pytest.raises(EntryNotFoundError):
        store.restore("zzz")


def test_a_failed_transaction_leaves_nothing(e2_store) -> None:
    store, _ = e2_store
    events = len(store.events())
    with pytest.raises(RuntimeError), store.transaction():
        store.mark_tainted(store.seqs_of(["a1"]), {"reason": "test"})
        raise RuntimeError("crash inside the transaction")
    assert not store.entry("a1").tainted and len(store.events()) == events


@pytest.mark.parametrize(
    ("tamper", "problem"),
    [
        ('UPDATE events SET details = \'{"reason":"forged"}\' WHERE seq = 1', "edited"),
        ("UPDATE events SET subjects = '[]' WHERE seq = 0", "edited"),
        ("DELETE FROM events WHERE seq = 0", "gap or reorder"),
        ("UPDATE events SET seq = 9 WHERE seq = 1", "gap or reorder"),
        ("UPDATE events SET prev_hash = hash WHERE seq = 1", "prev_hash"),
    ],
)
def test_event_chain_detects_edits_deletions_and_reordering(e2_store, tamper: str, problem: str) -> None:
    store, _ = e2_store
    store.mark_tainted(store.seqs_of(["b1"]), {"reason": "test"})
    assert store.verify_event_chain().ok
    store.execute(tamper)
    report = store.verify_event_chain()
    assert not report.ok and problem in report.problem


def test_read_only_and_missing_store(tmp_path: Path, e2_store, store_location: str) -> None:
    if store_location.endswith(".duckdb"):
        missing = str(tmp_path / "missing.duckdb")
    else:
        missing = store_location.rsplit("?schema=", 1)[0] + "?schema=never_created"
    with pytest.raises(StoreError, match="does not exist"):
        open_store(missing, read_only=True)
    store, _ = e2_store
    store.close()
    with open_store(store.path, read_only=True) as reader:
        assert reader.entry_count == 9
        with pytest.raises(StoreError, match="read-only"):
            reader.mark_tainted([0], {})


def test_entry_states_and_seq_lookups(e2_store) -> None:
    store, _ = e2_store
    seqs = store.seqs_of(["a2", "b3", "orphan"])
    assert store.entry_ids(seqs) == ["a2", "b3", "orphan"]
    store.quarantine(seqs[1:2], [0.6], {"reason": "test"})
    states = store.entry_states(seqs)
    assert states["quarantined"].tolist() == [False, True, False]
    assert np.array_equal(store.allowed_vector_seqs(), np.setdiff1d(np.arange(9), seqs[1:2]))
    with pytest.raises(EntryNotFoundError):
        store.seqs_of(["nope"])
    with pytest.raises(EntryNotFoundError):  # both engines: an unknown seq is an error, not a shorter answer
        store.entry_states(np.array([0, 999]))
