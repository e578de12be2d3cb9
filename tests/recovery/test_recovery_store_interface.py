"""Recovery depends on the ProvenanceStore interface only: no SQL, no engine-specific method.

A second engine (PostgreSQL) then only has to implement the Protocol; these tests pin that recovery
never reaches past it and that the DuckDB store satisfies it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rvu_pipelines.recovery.pipeline as pipeline
from rvu_pipelines.errors import EntryNotFoundError, StoreError
from rvu_pipelines.provenance import DuckDBProvenanceStore, ProvenanceStore, load_incident, open_store, write_incident
from rvu_pipelines.recovery import RecoveryFiles
from rvu_pipelines.recovery.reproductions import e2_records, e8_records

INTERFACE = {
    name
    for name in (*vars(ProvenanceStore), *ProvenanceStore.__annotations__)
    if not name.startswith("_") or name in ("__enter__", "__exit__")
}


class InterfaceOnly:
    """Wraps a store and refuses every attribute the ProvenanceStore Protocol does not declare."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name not in INTERFACE:
            raise AssertionError(f"recovery used {name!r}, which is not part of ProvenanceStore")
        return getattr(self._store, name)

    def __enter__(self) -> InterfaceOnly:
        return self

    def __exit__(self, *exc: object) -> None:
        self._store.close()


def test_the_duckdb_store_satisfies_the_protocol() -> None:
    with open_store(":memory:") as store:
        assert isinstance(store, DuckDBProvenanceStore) and isinstance(store, ProvenanceStore)


def test_open_store_refuses_an_engine_it_does_not_have() -> None:
    with pytest.raises(StoreError, match="DuckDB file path or a postgresql:// URL"):
        open_store("mysql://localhost/rvu")


def test_recovery_on_postgres_signs_the_same_certificate_as_on_duckdb(tmp_path: Path, postgres_location: str) -> None:
    """The scale profile's engine changes nothing a user sees: same seeds, same actions, same signed bytes."""
    incident = write_incident(e8_records(), tmp_path / "e8.jsonl")
    duck = pipeline.recover(
        incident, RecoveryFiles(tmp_path / "a.duckdb", tmp_path / "k", tmp_path / "a.json", index=tmp_path / "a.faiss")
    )
    pg = pipeline.recover(
        incident, RecoveryFiles(postgres_location, tmp_path / "k", tmp_path / "b.json", index=tmp_path / "b.faiss")
    )
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert pg.seeds == duck.seeds and pg.applied == duck.applied
    # a second recovery of the same incident on the same store: again the same on both engines
    pipeline.recover(
        incident, RecoveryFiles(tmp_path / "a.duckdb", tmp_path / "k", tmp_path / "c.json", index=tmp_path / "a.faiss")
    )
    pipeline.recover(
        incident, RecoveryFiles(postgres_location, tmp_path / "k", tmp_path / "d.json", index=tmp_path / "b.faiss")
    )
    assert (tmp_path / "c.json").read_bytes() == (tmp_path / "d.json").read_bytes()
    with open_store(postgres_location, read_only=True) as store, open_store(tmp_path / "a.duckdb") as reference:
        assert store.verify_event_chain().ok and store.path.startswith("postgresql://")
        assert [e.kind for e in store.events()] == [e.kind for e in reference.events()]


def test_recovery_through_the_interface_alone_gives_the_same_certificate(tmp_path: Path, monkeypatch) -> None:
    incident = write_incident(e8_records(), tmp_path / "e8.jsonl")
    plain = pipeline.recover(
        incident, RecoveryFiles(tmp_path / "a.duckdb", tmp_path / "k", tmp_path / "a.json", index=tmp_path / "a.faiss")
    )
    monkeypatch.setattr(pipeline, "open_store", lambda path: InterfaceOnly(open_store(path)))
    wrapped = pipeline.recover(
        incident, RecoveryFiles(tmp_path / "b.duckdb", tmp_path / "k", tmp_path / "b.json", index=tmp_path / "b.faiss")
    )
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert wrapped.seeds == plain.seeds and wrapped.applied == plain.applied


def test_manifest_rows_come_in_the_order_asked(tmp_path: Path) -> None:
    incident = load_incident(write_incident(e2_records(), tmp_path / "e2.jsonl"))
    with open_store(tmp_path / "s.duckdb") as store:
        pipeline.ingest_incident(store, incident)
        seqs = store.seqs_of(["b3", "load-b", "a1"])
        rows = store.manifest(seqs)
        assert [row.entry_id for row in rows] == ["b3", "load-b", "a1"]
        assert [row.seq for row in rows] == seqs.tolist()
        assert rows[1].action_type == "adapter_load" and rows[0].active_adapter_id == "adapter-b"
        assert store.manifest(np.zeros(0, dtype=np.int64)) == []
        with pytest.raises(EntryNotFoundError):
            store.manifest([store.entry_count + 5])
