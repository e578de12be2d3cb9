"""The namespace-keyed store: DuckDB by default, write-through on flush, M_0 reloaded on restart."""

from __future__ import annotations

from pathlib import Path

from rvu_pipelines.memory import Channel, DuckDBStore, InMemoryStore, MemoryItem, ReferenceMonitor, open_memory
from rvu_pipelines.memory.attacks import soul_item


def test_duckdb_store_round_trip_and_upsert(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "m.duckdb")
    items = [
        MemoryItem("b", "k", "v1", Channel.USER),
        MemoryItem("a", "k", "v2", Channel.WEB, tainted=True),
        soul_item(),
    ]
    store.upsert(items)
    store.upsert([MemoryItem("b", "k", "v3", Channel.SYSTEM)])
    loaded = store.load()
    assert [(i.namespace, i.key, i.value) for i in loaded] == [
        ("a", "k", "v2"),
        ("b", "k", "v3"),
        ("shared", "SOUL.md", soul_item().value),
    ]
    assert loaded[0].tainted and loaded[2].immutable and loaded[1].channel is Channel.SYSTEM
    store.close()


def test_monitor_writes_through_on_flush_and_reloads_m0(tmp_path: Path) -> None:
    path = tmp_path / "memory.duckdb"
    with open_memory(path) as m:
        m.install(soul_item())
        assert m.write("alice", "notes", "hello", channel=Channel.USER).accepted
        assert not m.write("alice", "evil", "x", channel=Channel.WEB).accepted
        assert m.promote("alice", "notes", authorizer=Channel.USER).accepted
        head = m.audit.head
    with open_memory(path) as again:
        assert [(i.namespace, i.key) for i in again.items()] == [
            ("alice", "notes"),
            ("shared", "SOUL.md"),
            ("shared", "notes"),
        ]
        assert again.is_immutable("SOUL.md")  # ι survives a restart
        assert not again.write("alice", "SOUL.md", "x", channel=Channel.SYSTEM).accepted
        assert again.audit.verify().ok
        first = next(again.audit.records())
        assert first.kind == "genesis"
        assert any(r.kind == "genesis" and r.payload()["source"] == "store" for r in again.audit.records())
        assert head in {r.hash for r in again.audit.records()}


def test_state_digest_pins_memory() -> None:
    a, b = ReferenceMonitor(InMemoryStore()), ReferenceMonitor(InMemoryStore())
    for m in (a, b):
        m.install(soul_item())
    assert a.state_digest() == b.state_digest()
    a.write("s", "k", "v", channel=Channel.USER)
    assert a.state_digest() != b.state_digest()
