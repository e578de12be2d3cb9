"""Benchmark the memory reference monitor: decisions/s single-call and batched, p50/p99 latency.

Usage:  .venv/bin/python benchmarks/bench_monitor.py [--sizes 1000,10000,100000,1000000]
            [--single 200000] [--batch 1000000] [--json out.json]

For each store size (items in M_0 spread over 50 sessions + shared) it replays one random workload
(40% READ, 40% WRITE, 15% PROMOTE, 5% INTERNAL; all five channels; 0-3 belief dependencies per
WRITE; 80% address an existing item from its own session or the shared namespace, 10% another
session's namespace, 10% a key with no item yet) through

* ``submit`` one action at a time (latency of each call by perf_counter_ns) with the audit log in
  each durability mode: in memory (the default: the chain lives in the process), persisted to
  DuckDB at every seal (``flush_on_seal``: a crash loses at most 1023 pending decisions), persisted
  only at the final flush, and off. The chain is sealed every 1024 decisions inside the call that
  fills it, so each mode reports the amortised per-call cost including the seal (and the final
  flush) and the p50/p99 of the sealing calls apart from the rest, and
* ``check_batch`` (decide only) and ``submit_batch`` (decide + commit + audit) on one large batch,
  and 1,000-action batches for per-batch latency.

Goals: >= 1,000,000 decisions/s batched, p99 < 20 µs per single check. The seed (§9.6)
reports "< 1 ms per check" for its implementation; it is printed beside our figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench_results import Row, add_results_dir_argument, record

from rvu_pipelines.memory import (
    Action,
    BatchActions,
    Channel,
    Internal,
    MemoryItem,
    Promote,
    Read,
    ReferenceMonitor,
    Write,
)
from rvu_pipelines.memory.audit import AuditLog, DuckDBAuditSink
from rvu_pipelines.memory.model import Op

N_SESSIONS = 50
N_NODES = 10_000
SEED_CLAIM = "< 1 ms per check (seed §9.6)"
GOAL_BATCHED_PER_S = 1_000_000
GOAL_SINGLE_P99_US = 20.0
SEED_CLAIM_US = 1000.0


@dataclass
class World:
    monitor: ReferenceMonitor
    sessions: np.ndarray  # namespace codes
    keys: np.ndarray  # key codes of existing items
    item_ns: np.ndarray  # namespace code of each existing item
    new_keys: np.ndarray  # key codes of keys with no item yet


def build_world(n_items: int, rng: np.random.Generator, audit: bool = True) -> World:
    m = ReferenceMonitor(audit=AuditLog() if audit else False)
    names = [f"session-{i:02d}" for i in range(N_SESSIONS)]
    namespaces = names + [m.shared]
    channels = list(Channel)
    ns_of = rng.integers(0, len(namespaces), n_items)
    ch_of = rng.integers(0, 5, n_items)
    tainted = rng.random(n_items) < 0.1
    items = [
        MemoryItem(namespaces[ns_of[i]], f"k{i}", f"value {i}", channels[ch_of[i]], bool(tainted[i]), i < 100)
        for i in range(n_items)
    ]
    m.install_many(items)
    for i in range(N_NODES):  # belief graph: labelled inputs and model outputs over them
        s = names[i % N_SESSIONS]
        if i < 2 * N_SESSIONS or rng.random() < 0.5:
            m.observe(s, channels[int(rng.integers(0, 5))], "input")
        else:
            m.derive(s, [int(x) for x in rng.integers(0, m.n_nodes, 2)])
        if i % 20 == 19:
            m.reset_context(s)
    codes = m.intern_namespaces(namespaces)
    keys = m.intern_keys([f"k{i}" for i in range(n_items)])
    new_keys = m.intern_keys([f"new{i}" for i in range(max(1000, n_items // 10))])
    return World(m, codes[:N_SESSIONS], keys, codes[ns_of], new_keys)


def workload(w: World, n: int, rng: np.random.Generator) -> BatchActions:
    op = rng.choice(np.array([Op.READ, Op.WRITE, Op.PROMOTE, Op.INTERNAL], np.uint8), n, p=[0.4, 0.4, 0.15, 0.05])
    item = rng.integers(0, w.keys.size, n)  # most actions address an existing item ...
    ns = w.item_ns[item]
    random_session = w.sessions[rng.integers(0, w.sessions.size, n)]
    session = np.where(ns == 0, random_session, ns)  # ... from its own session (shared items: any session)
    where = rng.random(n)
    namespace = np.where(where < 0.9, ns, random_session)  # 10%: another (or the same) session's namespace
    namespace = np.where(op == Op.INTERNAL, session, namespace).astype(np.int32)
    key = np.where(
        rng.random(n) < 0.9,
        w.keys[item],  # 10%: a key with no item yet
        w.new_keys[rng.integers(0, w.new_keys.size, n)],
    ).astype(np.int32)
    channel = rng.integers(0, 5, n).astype(np.uint8)
    n_deps = np.where(op == Op.WRITE, rng.integers(0, 4, n), 0)
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(n_deps, out=dep_ptr[1:])
    dep_idx = rng.integers(0, w.monitor.n_nodes, int(dep_ptr[-1])).astype(np.int64)
    values = [f"proposed value {i % 997}" for i in range(n)]
    return BatchActions(op, session.astype(np.int32), namespace, key, channel, dep_ptr, dep_idx, values)


def to_actions(w: World, b: BatchActions) -> list[Action]:
    m = w.monitor
    ns_names, key_names = m.namespace_names, m.key_names
    out: list[Action] = []
    for i in range(len(b)):
        s = ns_names[int(b.session[i])]
        ns = ns_names[int(b.namespace[i])]
        k = key_names[int(b.key[i])]
        ch = Channel(int(b.channel[i]))
        o = int(b.op[i])
        if o == Op.WRITE:
            deps = tuple(int(x) for x in b.dep_idx[b.dep_ptr[i] : b.dep_ptr[i + 1]])
            out.append(Write(s, k, b.values[i], ch, deps, ns))  # type: ignore[index]
        elif o == Op.READ:
            out.append(Read(s, k, ns))
        elif o == Op.PROMOTE:
            out.append(Promote(s, k, ch, ns))
        else:
            out.append(Internal(s))
    return out


def time_single(m: ReferenceMonitor, actions: list[Action]) -> dict[str, float | int | str]:
    """Per-call latency of ``submit``; the calls whose append sealed the hash chain are told apart.

    The audit log chains its pending records every ``seal_every`` (1024) decisions inside the call
    that fills it, so the per-call cost *including the seal* is reported as the amortised figure
    (every call's time plus the final flush, over the calls) and as the p50/p99 of the sealing calls.
    """
    n = len(actions)
    lat = np.empty(n, np.int64)
    sealed = np.zeros(n, np.bool_)
    audit = m.audit
    clock = time.perf_counter_ns
    submit = m.submit
    gc.disable()
    start = clock()
    if audit is None:
        for i, a in enumerate(actions):
            t0 = clock()
            submit(a)
            lat[i] = clock() - t0
    else:
        seq = audit.sealed  # a seal moves it; read outside the timed span
        for i, a in enumerate(actions):
            t0 = clock()
            submit(a)
            lat[i] = clock() - t0
            if audit.sealed != seq:
                sealed[i] = True
                seq = audit.sealed
    total = clock() - start
    tail = 0
    if audit is not None:
        t0 = clock()
        audit.flush()  # what is left of the chain work (and, with a sink, of the writes) is part of the cost
        tail = clock() - t0
    gc.enable()
    us = lat / 1000.0
    seal_us = us[sealed]
    return {
        "durability": "no audit log" if audit is None else audit.durability,
        "decisions_per_s": n / ((total + tail) / 1e9),
        "amortised_us": (float(lat.sum()) + tail) / n / 1000.0,
        "p50_us": float(np.percentile(us, 50)),
        "p99_us": float(np.percentile(us, 99)),
        "p999_us": float(np.percentile(us, 99.9)),
        "max_us": float(us.max()),
        "sealing_calls": int(sealed.sum()),
        "sealing_p50_us": float(np.percentile(seal_us, 50)) if seal_us.size else 0.0,
        "sealing_p99_us": float(np.percentile(seal_us, 99)) if seal_us.size else 0.0,
        "non_sealing_p99_us": float(np.percentile(us[~sealed], 99)),
        "final_flush_us": tail / 1000.0,
    }


def print_single(label: str, r: dict) -> None:
    line = (
        f"  {label:<22} {r['decisions_per_s']:>12,.0f} decisions/s   amortised {r['amortised_us']:6.2f} us/call"
        f"   p50 {r['p50_us']:6.2f} us   p99 {r['p99_us']:6.2f} us   p99.9 {r['p999_us']:7.2f} us"
        f"   max {r['max_us']:9.1f} us"
    )
    print(line)
    if r["sealing_calls"]:
        print(
            f"  {'':<22} {r['sealing_calls']:,} calls sealed the chain: p50 {r['sealing_p50_us']:8.1f} us"
            f"   p99 {r['sealing_p99_us']:8.1f} us; other calls p99 {r['non_sealing_p99_us']:6.2f} us;"
            f" final flush {r['final_flush_us']:,.0f} us"
        )
    print(f"  {'':<22} durability: {r['durability']}")


def slice_batch(b: BatchActions, lo: int, hi: int) -> BatchActions:
    p0, p1 = int(b.dep_ptr[lo]), int(b.dep_ptr[hi])
    return BatchActions(
        b.op[lo:hi],
        b.session[lo:hi],
        b.namespace[lo:hi],
        b.key[lo:hi],
        b.channel[lo:hi],
        b.dep_ptr[lo : hi + 1] - p0,
        b.dep_idx[p0:p1],
        None if b.values is None else b.values[lo:hi],
    )


def time_batches(m: ReferenceMonitor, b: BatchActions, small: int = 1000, reps: int = 200) -> dict[str, float]:
    n = len(b)
    out: dict[str, float] = {}
    m.check_batch(slice_batch(b, 0, small))  # warm the numpy caches
    best = min(_timed(lambda: m.check_batch(b)) for _ in range(3))
    out["check_batch_decisions_per_s"] = n / best
    lat = (
        np.array(
            [
                _timed(lambda i=i: m.check_batch(slice_batch(b, i * small, (i + 1) * small)))
                for i in range(min(reps, n // small))
            ]
        )
        * 1e6
    )
    out["check_batch1k_p50_us"] = float(np.percentile(lat, 50))
    out["check_batch1k_p99_us"] = float(np.percentile(lat, 99))
    out["submit_batch_decisions_per_s"] = n / _timed(lambda: m.submit_batch(b))
    lat = (
        np.array(
            [
                _timed(lambda i=i: m.submit_batch(slice_batch(b, i * small, (i + 1) * small)))
                for i in range(min(reps, n // small))
            ]
        )
        * 1e6
    )
    out["submit_batch1k_p50_us"] = float(np.percentile(lat, 50))
    out["submit_batch1k_p99_us"] = float(np.percentile(lat, 99))
    return out


def _timed(fn) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def theorem_traces(n_traces: int, seed: int = 42, length: int = 40) -> dict[str, object]:
    """Random action traces through the TheoremChecker (the test suite runs a few thousand)."""
    import random

    from rvu_pipelines.memory import TheoremChecker

    rnd = random.Random(seed)
    sessions, keys = ("s1", "s2", "s3"), ("SOUL.md", "k0", "k1", "k2")
    namespaces = (None, None, *sessions, "shared")
    channels = list(Channel)
    failures, steps, tainted = 0, 0, 0
    t0 = time.perf_counter()
    for _ in range(n_traces):
        m = ReferenceMonitor()
        m.install_many(
            [MemoryItem("shared", "SOUL.md", "soul", Channel.SYSTEM, immutable=True)]
            + [
                MemoryItem(
                    rnd.choice(namespaces[2:]), rnd.choice(keys[1:]), "v", rnd.choice(channels), rnd.random() < 0.3
                )
                for _ in range(rnd.randrange(4))
            ]
        )
        rt = TheoremChecker(m)
        for _ in range(length):
            s, k, c, ns = rnd.choice(sessions), rnd.choice(keys), rnd.choice(channels), rnd.choice(namespaces)
            deps = [rnd.randrange(m.n_nodes) for _ in range(rnd.randrange(3))] if m.n_nodes else []
            kind = rnd.randrange(7)
            if kind == 0:
                rt.observe(s, c, "x")
            elif kind == 1:
                rt.derive(s, deps if rnd.random() < 0.5 else None)
            elif kind == 2:
                rt.reset_context(s)
            elif kind == 3:
                rt.read(s, k, ns)
            elif kind == 4:
                rt.write(s, k, rnd.choice("xy"), channel=c, deps=deps, namespace=ns)
            elif kind == 5:
                rt.promote(s, k, authorizer=c, source=ns)
            else:
                rt.internal(s)
        report = rt.finish(sessions)
        failures += not (report.holds and report.untrusted_modifications == 0)
        steps += report.steps
        tainted += report.tainted_writes
    return {
        "traces": n_traces,
        "steps": steps,
        "tainted_writes": tainted,
        "violating_traces": failures,
        "seconds": time.perf_counter() - t0,
    }


def headline_rows(rows: list[dict], batch: int) -> list[Row]:
    """Single audited calls vs one batch at each size; at the largest, the goals and the seed's claim."""
    out = [
        Row(
            f"decisions/s, {r['items']:,} items",
            "submit, one call each (audited)",
            r["single"]["decisions_per_s"],
            f"submit_batch ({batch:,})",
            r["batch"]["submit_batch_decisions_per_s"],
            "decisions/s",
            True,
        )
        for r in rows
    ]
    if rows:
        last = max(rows, key=lambda r: r["items"])
        size = f"{last['items']:,} items"
        out += [
            Row(
                f"check_batch decisions/s, {size}",
                "goal",
                GOAL_BATCHED_PER_S,
                f"check_batch ({batch:,})",
                last["batch"]["check_batch_decisions_per_s"],
                "decisions/s",
                True,
            ),
            Row(
                f"single check p99, {size}",
                "goal",
                GOAL_SINGLE_P99_US,
                "submit, audited",
                last["single"]["p99_us"],
                "µs",
                False,
            ),
            Row(
                f"single check amortised (incl. seal), {size}",
                "seed claim < 1 ms (§9.6)",
                SEED_CLAIM_US,
                "submit, audited",
                last["single"]["amortised_us"],
                "µs",
                False,
            ),
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--single", type=int, default=200_000, help="single calls per size")
    parser.add_argument("--batch", type=int, default=1_000_000, help="actions in the large batch")
    parser.add_argument("--traces", type=int, default=20_000, help="random Theorem 1 traces to check")
    parser.add_argument("--json", default=None, help="also write the results here")
    add_results_dir_argument(parser)
    args = parser.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    print(
        f"memory reference monitor benchmark | python {platform.python_version()} | numpy {np.__version__} | "
        f"{platform.machine()}"
    )
    print("goals: >= 1,000,000 decisions/s batched; p99 < 20 us per single check; seed: " + SEED_CLAIM)
    rows = []
    for size in sizes:
        rng = np.random.default_rng(42)
        t0 = time.perf_counter()
        w = build_world(size, rng)
        setup = time.perf_counter() - t0
        b = workload(w, args.batch, rng)
        actions = to_actions(w, slice_batch(b, 0, min(args.single, len(b))))
        single = time_single(w.monitor, actions)  # the default: in-memory audit log
        audit = w.monitor.audit
        persisted = {}
        import polars  # noqa: F401  (the DuckDB sink imports it at its first write: keep that out of the timings)

        with tempfile.TemporaryDirectory(prefix="rvu_bench_audit_") as tmp:
            for mode, flush_on_seal in (("every_seal", True), ("on_flush", False)):
                log = AuditLog(DuckDBAuditSink(Path(tmp) / f"{mode}.duckdb"), flush_on_seal=flush_on_seal)
                w.monitor.audit = log
                persisted[mode] = time_single(w.monitor, actions)
                persisted[mode]["records_persisted"] = sum(1 for _ in log.sink.iter_records())  # type: ignore[union-attr]
                log.close()
        w.monitor.audit = None
        single_off = time_single(w.monitor, actions)
        w.monitor.audit = audit
        batch = time_batches(w.monitor, b)
        ok = w.monitor.audit.verify().ok if w.monitor.audit is not None else None
        row = {
            "items": size,
            "setup_s": setup,
            "single": single,
            "single_persisted_every_seal": persisted["every_seal"],
            "single_persisted_on_flush": persisted["on_flush"],
            "single_no_audit": single_off,
            "batch": batch,
            "audit_records": len(w.monitor.audit) if w.monitor.audit else 0,
            "audit_verifies": ok,
        }
        rows.append(row)
        print(f"\nstore {size:>9,} items (setup {setup:.1f} s; audit {row['audit_records']:,} records, verifies: {ok})")
        print_single("single, audited", single)
        print_single("single, persisted/seal", persisted["every_seal"])
        print_single("single, persisted/end", persisted["on_flush"])
        print_single("single, no audit", single_off)
        print(f"  {'':<22} seed: {SEED_CLAIM}")
        print(
            f"  check_batch  ({args.batch:,})  {batch['check_batch_decisions_per_s']:>12,.0f} decisions/s   "
            f"1k-batch p50 {batch['check_batch1k_p50_us']:8.1f} us  p99 {batch['check_batch1k_p99_us']:8.1f} us"
        )
        print(
            f"  submit_batch ({args.batch:,})  {batch['submit_batch_decisions_per_s']:>12,.0f} decisions/s   "
            f"1k-batch p50 {batch['submit_batch1k_p50_us']:8.1f} us  p99 {batch['submit_batch1k_p99_us']:8.1f} us"
        )
        del w, b, actions
        gc.collect()
    traces = theorem_traces(args.traces) if args.traces else None
    if traces:
        print(
            f"\nTheorem 1 over {traces['traces']:,} random traces ({traces['steps']:,} checked actions, "
            f"{traces['tainted_writes']:,} tainted writes): {traces['violating_traces']} violating traces "
            f"({traces['seconds']:.0f} s)"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {"seed_claim": SEED_CLAIM, "rows": rows, "theorem_traces": traces}, handle, indent=2, sort_keys=True
            )
    record(__file__, headline_rows(rows, args.batch), args.results_dir)


if __name__ == "__main__":
    main()
