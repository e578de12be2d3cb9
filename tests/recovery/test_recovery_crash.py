"""SIGKILL a recovery while it applies tiers; the store and the index stay consistent, a re-run converges.

The recovery runs in a subprocess with ``RVU_FAULT_PAUSE_AFTER_TIER_STEPS=N``: after its N-th tier step
it writes a marker and sleeps; the test kills it with SIGKILL, exactly as a crash at that point would.
Step 2: inside the store transaction, flag and quarantine done but not committed, the index thread racing.
Step 5: index removals saved, store changes not committed (the window between index and store).
Step 6: committed, certificate not written yet.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import pytest

from rvu_pipelines.provenance import open_store, write_incident
from rvu_pipelines.recovery import RecoveryFiles, recover
from rvu_pipelines.recovery.reproductions import e8_records
from rvu_pipelines.recovery.tiers import FAULT_MARKER_ENV, FAULT_PAUSE_ENV
from rvu_pipelines.recovery.vector_index import VectorIndex

REPO = Path(__file__).resolve().parents[2]
SCRIPT = (
    "import sys; from rvu_pipelines.recovery import RecoveryFiles, recover; a = sys.argv; "
    "recover(a[1], RecoveryFiles(a[2], a[4], a[5], index=a[3]))"
)


def run_until_paused(tmp: Path, incident: Path, keys: Path, step: int) -> dict[str, Path]:
    paths = {"store": tmp / "store.duckdb", "index": tmp / "index.faiss", "cert": tmp / "cert.json"}
    marker = tmp / "paused"
    env = {**os.environ, FAULT_PAUSE_ENV: str(step), FAULT_MARKER_ENV: str(marker)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SCRIPT,
            str(incident),
            str(paths["store"]),
            str(paths["index"]),
            str(keys),
            str(paths["cert"]),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"recovery exited before pausing: {process.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("recovery never reached the fault point")
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert not paths["cert"].exists()
    return paths


@pytest.fixture(scope="module")
def clean_certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, bytes]:
    tmp = tmp_path_factory.mktemp("clean")
    incident = write_incident(e8_records(), tmp / "incident.jsonl")
    keys = tmp / "keys"
    recover(incident, RecoveryFiles(tmp / "store.duckdb", keys, tmp / "cert.json", index=tmp / "index.faiss"))
    return incident, keys, (tmp / "cert.json").read_bytes()


@pytest.mark.parametrize("step", [2, 5, 6])
def test_sigkill_during_tiers_leaves_store_and_index_consistent(tmp_path: Path, clean_certificate, step: int) -> None:
    incident, keys, expected = clean_certificate
    paths = run_until_paused(tmp_path, incident, keys, step)

    with open_store(paths["store"]) as store:
        assert store.verify_event_chain().ok
        allowed = set(store.allowed_vector_seqs().tolist())
        quarantined = int(store.entry_states(np.arange(store.entry_count))["quarantined"].sum())
        assert quarantined == (1 if step == 6 else 0)  # uncommitted tier changes are gone after the kill
        isolated = store.seqs_of(["t1", "m1", "t2"])
        # on disk, before any repair: the index holds nothing the store forbids (removals go index-first)
        raw = faiss.read_index(str(paths["index"]))
        on_disk = set(faiss.vector_to_array(raw.id_map).tolist())
        assert on_disk <= allowed
        assert not on_disk & set(isolated.tolist())
        # opening reconciles: vectors the crash removed early come back for entries the store still allows
        index = VectorIndex.open(paths["index"], store)
        assert set(index.ids().tolist()) == allowed
        _, found = index.search(store.vectors(isolated), index.ntotal)
        retrievable = set(found.ravel().tolist())
        for seq, state in zip(isolated.tolist(), zip(*store.entry_states(isolated).values(), strict=True), strict=True):
            tainted, quarantined_now, purged = state
            if quarantined_now or purged:
                assert seq not in retrievable

    recover(incident, RecoveryFiles(paths["store"], keys, paths["cert"], index=paths["index"]))
    assert paths["cert"].read_bytes() == expected  # re-running converges to the clean run's certificate
    with open_store(paths["store"]) as store:
        assert store.verify_event_chain().ok
        index = VectorIndex.open(paths["index"], store)
        assert np.array_equal(index.ids(), store.allowed_vector_seqs())
        assert not set(index.ids().tolist()) & set(store.seqs_of(["t1", "m1", "t2"]).tolist())
