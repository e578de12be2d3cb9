"""Tier actions on store + FAISS index: effects, idempotence, restore, and store/index reconciliation."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest

from rvu_pipelines.errors import EntryNotFoundError, RestoreError
from rvu_pipelines.provenance import open_store, write_incident
from rvu_pipelines.recovery import RecoveryFiles, RecoveryOptions
from rvu_pipelines.recovery.pipeline import recover, restore
from rvu_pipelines.recovery.reproductions import e8_records
from rvu_pipelines.recovery.tiers import TierPlan, apply_tiers, restore_entry
from rvu_pipelines.recovery.vector_index import VectorIndex


class RecordingRuntime:
    def __init__(self) -> None:
        self.unloaded: list[str] = []

    def unload(self, adapter_id: str) -> None:
        self.unloaded.append(adapter_id)


@pytest.fixture
def recovered(tmp_path: Path):
    incident = write_incident(e8_records(), tmp_path / "e8.jsonl")
    runtime = RecordingRuntime()
    paths = {
        "store": tmp_path / "store.duckdb",
        "index": tmp_path / "index.faiss",
        "keys": tmp_path / "keys",
        "cert": tmp_path / "cert.json",
        "incident": incident,
    }
    result = recover(
        incident,
        RecoveryFiles(paths["store"], paths["keys"], paths["cert"], index=paths["index"]),
        RecoveryOptions(runtime=runtime),
    )
    return result, paths, runtime


def index_ids(path: Path) -> set[int]:
    index = faiss.read_index(str(path))
    return set(faiss.vector_to_array(index.id_map).tolist()) if index.ntotal else set()


def test_each_tier_does_what_it_says(recovered) -> None:
    result, paths, runtime = recovered
    assert result.tiers == {
        "t2": "evict",
        "m1": "evict",
        "t1": "quarantine",
        "load-mail": "flag",
        "s1": "flag",
        "c1": "flag",
        "load-fin": "flag",
        "u1": "flag",  # R = 0.3 exactly: its spread counts against the incident's population, not the store's
        "fuse-mail": "none",
        "r1": "none",
        "a1": "none",
    }
    with open_store(paths["store"]) as store:
        t1, m1, t2, c1, u1 = (store.entry(e) for e in ("t1", "m1", "t2", "c1", "u1"))
        assert t1.quarantined and t1.tainted and not t1.purged and t1.content.startswith("Invoice")  # row kept
        assert m1.purged and t2.purged and c1.tainted and not c1.purged and u1.tainted and not u1.purged
        mail = {a.adapter_id: a for a in store.adapters()}["mail-lora"]
        assert mail.purged and mail.tainted and mail.unloaded_at is not None
        assert {a.adapter_id for a in store.adapters() if a.tainted} == {"fin-lora", "mail-lora"}
        present = index_ids(paths["index"])
        assert t1.seq not in present and m1.seq not in present and t2.seq not in present
        assert c1.seq in present and u1.seq in present  # flagged entries stay retrievable
        assert present == set(store.allowed_vector_seqs().tolist())
    assert runtime.unloaded == ["mail-lora"]


def test_applying_the_same_plan_twice_changes_nothing(recovered) -> None:
    _, paths, _ = recovered
    with open_store(paths["store"]) as store:
        index = VectorIndex.open(paths["index"], store)
        events, ids = len(store.events()), index.ids()
        graph = store.graph()
        t1, m1, t2 = store.seqs_of(["t1", "m1", "t2"])
        plan = TierPlan(
            flag=np.array(sorted([t1, m1, t2])),
            quarantine=np.array([t1]),
            quarantine_risk=np.array([0.66]),
            purge=np.array(sorted([m1, t2])),
            evict_adapters=np.array([graph.adapter[t2]]),
            tainted_adapters=np.array([0, 1]),
        )
        outcome = apply_tiers(store, index, plan)
        assert not outcome.changed, outcome.counts()
        assert len(store.events()) == events and np.array_equal(index.ids(), ids)


def test_rerunning_recovery_is_a_no_op_with_identical_certificate(recovered) -> None:
    result, paths, _ = recovered
    first = paths["cert"].read_bytes()
    again = recover(
        paths["incident"], RecoveryFiles(paths["store"], paths["keys"], paths["cert"], index=paths["index"])
    )
    assert all(count == 0 for count in again.applied.values()), again.applied
    assert paths["cert"].read_bytes() == first


def test_restore_re_adds_the_vector_and_logs_it(recovered) -> None:
    _, paths, _ = recovered
    with open_store(paths["store"]) as store:
        seq = store.entry("t1").seq
        vector = store.vectors([seq])
    assert seq not in index_ids(paths["index"])
    assert restore("t1", paths["store"], paths["index"]) is True
    assert seq in index_ids(paths["index"])
    with open_store(paths["store"]) as store:
        assert not store.entry("t1").quarantined
        assert store.events()[-1].kind == "restored" and store.events()[-1].subjects == [seq]
        index = VectorIndex.open(paths["index"], store)
        _, found = index.search(vector, 1)
        assert found[0][0] == seq  # retrievable again
        events = len(store.events())
    assert restore("t1", paths["store"], paths["index"]) is False  # idempotent
    with open_store(paths["store"]) as store:
        assert len(store.events()) == events


@pytest.mark.parametrize(
    ("entry_id", "error"), [("m1", RestoreError), ("c1", RestoreError), ("zz", EntryNotFoundError)]
)
def test_restore_refuses_what_cannot_be_restored(recovered, entry_id: str, error: type) -> None:
    _, paths, _ = recovered
    with pytest.raises(error):
        restore(entry_id, paths["store"], paths["index"])


def test_purged_vectors_are_never_returned_by_search(recovered) -> None:
    _, paths, _ = recovered
    with open_store(paths["store"]) as store:
        index = VectorIndex.open(paths["index"], store)
        isolated = store.seqs_of(["t1", "m1", "t2"])
        _, found = index.search(store.vectors(isolated), index.ntotal)
        assert not set(found.ravel().tolist()) & set(isolated.tolist())


def write_index(path: Path, ids: list[int], vectors: np.ndarray) -> None:
    index = faiss.IndexIDMap(faiss.IndexFlatIP(vectors.shape[1]))
    if ids:
        index.add_with_ids(vectors, np.array(ids, dtype=np.int64))
    faiss.write_index(index, str(path))


@pytest.mark.parametrize(
    "damage", ["stale_purged_vector", "missing_vectors", "corrupt_file", "wrong_dimension", "deleted"]
)
def test_index_is_reconciled_from_the_store_on_open(recovered, damage: str) -> None:
    _, paths, _ = recovered
    with open_store(paths["store"]) as store:
        allowed = set(store.allowed_vector_seqs().tolist())
        everything = np.arange(store.entry_count)
        all_vectors = store.vectors(everything)
    if damage == "stale_purged_vector":  # as if a crash undid the index write of a purge
        write_index(paths["index"], everything.tolist(), all_vectors)
    elif damage == "missing_vectors":
        write_index(paths["index"], [], all_vectors)
    elif damage == "corrupt_file":
        paths["index"].write_bytes(b"not a faiss index")
    elif damage == "wrong_dimension":
        write_index(paths["index"], [0], np.ones((1, 8), dtype=np.float32))
    else:
        paths["index"].unlink()
    with open_store(paths["store"]) as store:
        index = VectorIndex.open(paths["index"], store)
        assert set(index.ids().tolist()) == allowed
    assert index_ids(paths["index"]) == allowed  # and the repaired index was saved


def test_restore_entry_without_index(recovered) -> None:
    _, paths, _ = recovered
    with open_store(paths["store"]) as store:
        assert restore_entry(store, None, "t1") is True
        assert not store.entry("t1").quarantined
