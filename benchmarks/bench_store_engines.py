"""The provenance store's two engines side by side: DuckDB (embedded default) vs PostgreSQL (scale profile).

Run:  .venv/bin/python benchmarks/bench_store_engines.py                 (10^6 entries, 10 incidents, 4 workers)
      .venv/bin/python benchmarks/bench_store_engines.py --entries 100000 --incidents 6 --workers 2

Starts a throw-away PostgreSQL server (the machine's binaries, fsync off as in the tests) and prints:
1. bulk load of a synthetic agent-trace graph (DuckDB one INSERT per table vs PostgreSQL COPY) and the graph read
   recovery starts from (DuckDB fetchnumpy vs PostgreSQL COPY TO STDOUT into polars), seconds and ratio;
2. recovery of N incidents: sequential on one DuckDB file vs N recoveries in a pool of W worker processes against
   one PostgreSQL store; every incident's tier counts must equal the DuckDB run's, the event chain must verify, and
   no event may be lost or duplicated (one ``ingested`` event per incident, each entry ingested once); the
   peak number of server connections during the parallel run is read from pg_stat_activity.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_results import Row, add_results_dir_argument  # noqa: E402
from bench_results import record as record_rows  # noqa: E402 (`record` names E8's records below)

from rvu_pipelines.provenance import open_store, write_incident  # noqa: E402
from rvu_pipelines.recovery import (
    RecoveryFiles,  # noqa: E402
    pipeline,  # noqa: E402
)
from rvu_pipelines.recovery.reproductions import e8_records  # noqa: E402
from rvu_pipelines.scale.postgres_server import LocalPostgres, free_port  # noqa: E402


def synthetic_graph(n: int, seed: int = 0) -> dict[str, Any]:
    """Episodes of ~20 entries: a root, then each entry's parent is its predecessor (80 %) or an earlier entry of the
    episode; 30 % of entries run under one of n/1000 adapters."""
    rng = np.random.default_rng(seed)
    episode_start = np.zeros(n, dtype=np.int64)
    starts = np.flatnonzero(rng.random(n) < 0.05)
    episode_start[starts] = starts
    episode_start = np.maximum.accumulate(episode_start)
    offset = np.arange(n) - episode_start
    back = np.where(rng.random(n) < 0.8, 1, rng.integers(1, np.maximum(offset, 1) + 1))
    parent = np.where(offset > 0, np.arange(n) - np.minimum(back, offset), -1)
    n_adapters = max(1, n // 1000)
    adapter = np.where(rng.random(n) < 0.3, rng.integers(0, n_adapters, n), -1)
    return {
        "entry_ids": np.array([f"e{i}" for i in range(n)], dtype=object),
        "parent_seq": parent.astype(np.int64),
        "adapter_seq": adapter.astype(np.int64),
        "contamination": rng.random(n) * 0.01,
        "adapter_ids": np.array([f"a{i}" for i in range(n_adapters)], dtype=object),
        "influence": rng.beta(0.5, 2.0, n_adapters),
    }


def timed(fn: Any, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench_bulk(server: LocalPostgres, workdir: Path, n: int) -> list[Row]:
    graph = synthetic_graph(n)
    with open_store(workdir / "bulk.duckdb") as duck:
        started = time.perf_counter()
        duck.bulk_load(**graph)  # type: ignore[attr-defined]
        duck_load = time.perf_counter() - started
        duck_read = timed(duck.graph)
        reference = duck.graph()
    with open_store(f"{server.url('postgres')}?schema=bench_bulk") as pg:
        started = time.perf_counter()
        pg.bulk_load(**graph)  # type: ignore[attr-defined]
        pg_load = time.perf_counter() - started
        pg_read = timed(pg.graph)
        same = np.array_equal(pg.graph().parent, reference.parent) and np.array_equal(
            pg.graph().adapter, reference.adapter
        )
    print(f"\n1. bulk load + graph read, {n:,} entries ({len(graph['adapter_ids']):,} adapters)")
    print(
        f"   load: DuckDB {duck_load:6.2f} s   PostgreSQL COPY {pg_load:6.2f} s   "
        f"ratio pg/duckdb {pg_load / duck_load:.1f}x"
    )
    print(
        f"   graph read (median of 3): DuckDB {duck_read:6.3f} s   PostgreSQL {pg_read:6.3f} s   "
        f"ratio {pg_read / duck_read:.1f}x   same graph: {same}"
    )
    return [  # as printed: PostgreSQL / DuckDB
        Row(f"bulk load, {n:,} entries", "PostgreSQL COPY", pg_load, "DuckDB", duck_load, "s", False),
        Row(f"graph read (median of 3), {n:,} entries", "PostgreSQL", pg_read, "DuckDB", duck_read, "s", False),
    ]


def numbered_incident(k: int) -> list[dict[str, Any]]:
    """E8's incident with every id made unique to incident ``k`` (adapters too), so N incidents share a store."""
    ids = {r["entry_id"] for r in e8_records()}
    records = []
    for record in e8_records():
        copy = dict(record)
        for field in ("entry_id", "parent_id"):
            if copy.get(field) in ids:
                copy[field] = f"i{k}-{copy[field]}"
        for field in ("adapter_id", "active_adapter_id"):
            if copy.get(field):
                copy[field] = f"i{k}-{copy[field]}"
        copy["episode_id"] = f"i{k}-{copy['episode_id']}"
        records.append(copy)
    return records


def recover_one(args: tuple[str, str, str, str]) -> dict[str, int]:
    incident, store, folder, key_dir = args
    result = pipeline.recover(incident, RecoveryFiles(store, key_dir, Path(folder) / (Path(incident).stem + ".json")))
    return dict(result.tier_counts)


def peak_connections(server: LocalPostgres, stop: threading.Event, peak: list[int]) -> None:
    import psycopg

    with psycopg.connect(server.url(), autocommit=True) as connection:
        while not stop.is_set():
            count = connection.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
            row = count.fetchone()
            peak[0] = max(peak[0], int(row[0] if row else 0) - 1)  # not counting this monitor
            time.sleep(0.05)


def bench_recovery(server: LocalPostgres, workdir: Path, incidents: int, workers: int) -> list[Row]:
    files = [str(write_incident(numbered_incident(k), workdir / f"incident{k}.jsonl")) for k in range(incidents)]
    key_dir = str(workdir / "keys")
    started = time.perf_counter()
    sequential = [recover_one((f, str(workdir / "seq.duckdb"), str(workdir / "certs_seq"), key_dir)) for f in files]
    duck_seconds = time.perf_counter() - started
    location = f"{server.url('postgres')}?schema=bench_recovery"
    stop, peak = threading.Event(), [0]
    monitor = threading.Thread(target=peak_connections, args=(server, stop, peak), daemon=True)
    monitor.start()
    started = time.perf_counter()
    # spawn, not fork: a forked child inherits DuckDB/polars thread-pool locks mid-use and can hang on them
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        parallel = list(pool.map(recover_one, [(f, location, str(workdir / "certs_pg"), key_dir) for f in files]))
    pg_seconds = time.perf_counter() - started
    stop.set()
    monitor.join()
    with open_store(location, read_only=True) as store:
        events = store.events()
        ingested = [s for e in events if e.kind == "ingested" for s in e.subjects]
        chain = store.verify_event_chain()
        entries = store.entry_count
    expected_entries = sum(len(numbered_incident(k)) for k in range(incidents))
    print(f"\n2. recovery of {incidents} incidents ({expected_entries} entries)")
    print(f"   DuckDB, one process, sequential: {duck_seconds:6.2f} s")
    print(
        f"   PostgreSQL, {workers} worker processes:  {pg_seconds:6.2f} s   "
        f"ratio duckdb/pg {duck_seconds / pg_seconds:.2f}x"
    )
    print(
        f"   tier counts equal per incident: {parallel == sequential}; entries {entries}/{expected_entries}; "
        f"'ingested' events {sum(e.kind == 'ingested' for e in events)}/{incidents}; entries ingested twice: "
        f"{len(ingested) - len(set(ingested))}; lost: {expected_entries - len(set(ingested))}; chain ok: {chain.ok} "
        f"({chain.events} events)"
    )
    print(f"   peak client connections during the parallel run: {peak[0]} (workers: {workers})")
    return [  # as printed: DuckDB / PostgreSQL
        Row(
            f"recovery of {incidents} incidents",
            "DuckDB, one process, sequential",
            duck_seconds,
            f"PostgreSQL, {workers} worker processes",
            pg_seconds,
            "s",
            False,
        )
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--incidents", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    add_results_dir_argument(parser)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rvu-bench-store-"))
    workdir.chmod(0o711)
    server = LocalPostgres(workdir / "pg", free_port(), durable=False)
    try:
        server.start()
        print(f"PostgreSQL on 127.0.0.1:{server.port} (fsync off), DuckDB files under {workdir}")
        rows = bench_bulk(server, workdir, args.entries)
        rows += bench_recovery(server, workdir, args.incidents, args.workers)
    finally:
        server.stop("immediate")
        shutil.rmtree(workdir, ignore_errors=True)
    record_rows(__file__, rows, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
