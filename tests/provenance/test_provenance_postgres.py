"""What only the PostgreSQL store has to prove: several worker processes share one store without losing or
duplicating a row or forking the event chain, a worker killed mid-transaction leaves nothing and blocks nobody,
COPY bulk loads give the DuckDB store's rows, and a password never shows in a store's name."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from rvu_pipelines.errors import IncidentValidationError, StoreError
from rvu_pipelines.provenance import load_incident, open_store, write_incident
from rvu_pipelines.provenance.postgres_location import redact, split_location
from rvu_pipelines.recovery.pipeline import ingest_incident

WORKERS = 4
ENTRIES_PER_WORKER = 30


def _worker_records(worker: int) -> list[dict]:
    records: list[dict] = []
    for i in range(ENTRIES_PER_WORKER):
        record = {
            "kind": "action",
            "entry_id": f"w{worker}-e{i}",
            "episode_id": f"ep-{worker}",
            "timestamp": float(i),
            "action_type": "tool_output",
            "content": f"worker {worker} step {i}",
        }
        if i:
            record["parent_id"] = f"w{worker}-e{i - 1}"
        records.append(record)
    return records


def _ingest_and_taint(location: str, worker: int, folder: str) -> None:
    """One recovery worker: ingest its incident, then taint its entries in three small transactions."""
    incident = load_incident(write_incident(_worker_records(worker), Path(folder) / f"w{worker}.jsonl"))
    with open_store(location) as store:
        store.ingest(incident)
        seqs = store.seqs_of(incident.entry_ids)
        for chunk in np.array_split(seqs, 3):
            store.mark_tainted(chunk, {"worker": worker})
        store.mark_tainted(seqs, {"worker": worker, "retry": True})  # a retried step changes nothing


def test_parallel_workers_lose_and_duplicate_nothing(postgres_location: str, tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_ingest_and_taint, args=(postgres_location, w, str(tmp_path))) for w in range(WORKERS)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join(120)
        assert process.exitcode == 0
    with open_store(postgres_location, read_only=True) as store:
        assert store.entry_count == WORKERS * ENTRIES_PER_WORKER
        assert sorted(store.graph().parent.tolist()).count(-1) == WORKERS  # one root per worker's episode
        events = store.events()
        assert [e.kind for e in events].count("ingested") == WORKERS
        tainted = [s for e in events if e.kind == "tainted" for s in e.subjects]
        assert sorted(tainted) == list(range(WORKERS * ENTRIES_PER_WORKER))  # each entry exactly once
        assert store.verify_event_chain().ok
        assert [e.seq for e in events] == list(range(len(events)))


def _die_inside_a_transaction(location: str) -> None:
    with open_store(location) as store, store.transaction():
        store.mark_tainted([0, 1, 2], {"reason": "half done"})
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_mid_transaction_leaves_nothing_and_releases_the_lock(
    postgres_location: str, tmp_path: Path
) -> None:
    incident = load_incident(write_incident(_worker_records(0), tmp_path / "w0.jsonl"))
    with open_store(postgres_location) as store:
        ingest_incident(store, incident)
        events = len(store.events())
    process = multiprocessing.get_context("spawn").Process(target=_die_inside_a_transaction, args=(postgres_location,))
    process.start()
    process.join(60)
    assert process.exitcode == -signal.SIGKILL
    with open_store(postgres_location, lock_timeout_s=10) as store:
        assert not store.entry_states(np.array([0, 1, 2]))["tainted"].any()
        assert len(store.events()) == events
        assert store.mark_tainted([0], {"reason": "after the crash"}).tolist() == [0]  # the lock was released
        assert store.verify_event_chain().ok


def test_copy_bulk_load_gives_the_duckdb_rows(postgres_location: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 5_000
    parent = np.where(rng.random(n) < 0.8, np.arange(n) - 1, -1)
    parent[0] = -1
    adapter = np.where(rng.random(n) < 0.3, rng.integers(0, 7, n), -1)
    columns = {
        "entry_ids": np.array([f"e{i}" for i in range(n)], dtype=object),
        "parent_seq": parent.astype(np.int64),
        "adapter_seq": adapter.astype(np.int64),
        "contamination": rng.random(n),
        "adapter_ids": np.array([f"a{i}" for i in range(7)], dtype=object),
        "influence": rng.random(7),
        "vectors": rng.standard_normal((n, 8)).astype(np.float32),
    }
    with open_store(tmp_path / "bulk.duckdb") as duck, open_store(postgres_location) as pg:
        duck.bulk_load(**columns)  # type: ignore[attr-defined]
        pg.bulk_load(**columns)  # type: ignore[attr-defined]
        for name in ("parent", "adapter"):
            assert np.array_equal(getattr(duck.graph(), name), getattr(pg.graph(), name))
        assert np.allclose(duck.contamination_scores(), pg.contamination_scores(), rtol=0, atol=0)
        assert np.array_equal(duck.adapter_influence(), pg.adapter_influence())
        picks = rng.choice(n, 50, replace=False)
        assert duck.manifest(picks) == pg.manifest(picks)
        for entry_id in ("e0", "e1", f"e{n - 1}"):
            assert duck.entry(entry_id) == pg.entry(entry_id)
        assert np.array_equal(duck.vectors(picks), pg.vectors(picks))
        assert pg.verify_event_chain().ok


def test_a_nul_character_is_refused_by_line_before_anything_is_written(postgres_location: str, tmp_path: Path) -> None:
    records = _worker_records(0)
    records[3]["content"] = "before\x00after"
    incident = load_incident(write_incident(records, tmp_path / "nul.jsonl"))
    with open_store(postgres_location) as store:
        with pytest.raises(IncidentValidationError) as caught:
            store.ingest(incident)
        assert [(issue.line, issue.field) for issue in caught.value.issues] == [(4, "content")]
        assert "NUL" in str(caught.value) and store.entry_count == 0 and store.events() == []


def test_locations_name_their_schema_and_never_show_a_password() -> None:
    conninfo, schema = split_location("postgresql://rvu:s3cret@db.example:5432/rvu?schema=Team_A&sslmode=require")
    assert schema == "team_a" and "schema" not in conninfo and "sslmode=require" in conninfo
    assert "s3cret" not in redact("postgresql://rvu:s3cret@db.example:5432/rvu")
    with pytest.raises(StoreError, match="letters, digits"):
        split_location("postgresql://localhost/rvu?schema=x;drop table events")


def test_an_unreachable_server_is_a_clear_error() -> None:
    from rvu_pipelines.scale.postgres_server import free_port

    with pytest.raises(StoreError, match="Cannot connect to provenance store"):
        open_store(f"postgresql://rvu:hidden@127.0.0.1:{free_port()}/rvu", lock_timeout_s=1)


def test_postgres_killed_mid_recovery_fails_clearly_and_a_rerun_signs_the_same_certificate(
    postgres_server, postgres_location: str, tmp_path: Path
) -> None:
    """The server dies (immediate stop: a crash) while a recovery holds its tier transaction open; the recovery
    fails naming the lost store, nothing of the transaction survives, and after a restart the same recovery
    converges to the certificate of a run that was never interrupted (DuckDB's, byte for byte)."""
    import subprocess
    import sys
    import time

    from rvu_pipelines.recovery import RecoveryFiles, recover
    from rvu_pipelines.recovery.reproductions import e8_records
    from rvu_pipelines.recovery.tiers import FAULT_MARKER_ENV, FAULT_PAUSE_ENV

    incident = write_incident(e8_records(), tmp_path / "incident.jsonl")
    keys = tmp_path / "keys"
    recover(incident, RecoveryFiles(tmp_path / "clean.duckdb", keys, tmp_path / "clean.json"))
    marker = tmp_path / "paused"
    script = (
        "import sys; from rvu_pipelines.recovery import RecoveryFiles, recover; "
        "a = sys.argv; recover(a[1], RecoveryFiles(a[2], a[3], a[4]))"
    )
    env = {**os.environ, FAULT_PAUSE_ENV: "2", FAULT_MARKER_ENV: str(marker)}  # paused inside the tier transaction
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(incident), postgres_location, str(keys), str(tmp_path / "cert.json")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert process.poll() is None, process.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "recovery never reached the fault point"
            time.sleep(0.05)
        postgres_server.stop("immediate")
        marker.unlink()  # let the recovery go on into the dead server
        _, stderr = process.communicate(timeout=120)
    finally:
        postgres_server.start()
    assert process.returncode != 0 and "Lost the connection to provenance store" in stderr, stderr[-2000:]
    assert "postgresql://rvu@" in stderr and not (tmp_path / "cert.json").exists()
    with open_store(postgres_location) as store:
        assert store.verify_event_chain().ok
        assert not store.entry_states(np.arange(store.entry_count))["quarantined"].any()  # rolled back
    recover(incident, RecoveryFiles(postgres_location, keys, tmp_path / "cert.json"))
    assert (tmp_path / "cert.json").read_bytes() == (tmp_path / "clean.json").read_bytes()
    with open_store(postgres_location, read_only=True) as store:
        events = store.events()
        assert [e.kind for e in events].count("ingested") == 1 and store.entry_count == len(e8_records())
        assert store.verify_event_chain().ok
