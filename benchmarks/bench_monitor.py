"""Benchmark the memory reference monitor: decisions/s single-call and batched, p50/p99 latency.

Usage:  .venv/bin/python benchmarks/bench_monitor.py [--sizes 1000,10000,100000,1000000]
            [--single 200000] [--batch 1000000] [--json out.json]

For each store size (items in M_0 spread over 50 sessions + shared) it replays one random workload
(40% READ, 40% WRITE, 15% PROMOTE, 5% INTERNAL; all five channels; 0-3 belief dependencies per
WRITE; 80% address an existing item from its own session or the shared namespace, 10% another
session's namespace, 10% a key with no item yet) through

* ``submit`` one action at a time (latency of each call by perf_counter_ns), with the audit log on
  (the default) and off, and
* ``check_batch`` (decide only) and ``submit_batch`` (decide + commit + audit) on one large batch,
  and 1,000-action batches for per-batch latency.

Goals (issue 4): >= 1,000,000 decisions/s batched, p99 < 20 µs per single check. The seed (§9.6)
reports "< 1 ms per check" for its implementation; it is printed beside our figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import time
from dataclasses import dataclass

import numpy as np

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
from rvu_pipelines.memory.audit import AuditLog
from rvu_pipelines.memory.model import Op

N_SESSIONS = 50
N_NODES = 10_000
SEED_CLAIM = "< 1 ms per check (seed §9.6)"


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
    ns_names = m._ns_names  # noqa: SLF001 (benchmark decodes its own codes)
    key_names = m._key_names  # noqa: SLF001
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


def time_single(m: ReferenceMonitor, actions: list[Action]) -> dict[str, float]:
    lat = np.empty(len(actions), np.int64)
    clock = time.perf_counter_ns
    submit = m.submit
    gc.disable()
    start = clock()
    for i, a in enumerate(actions):
        t0 = clock()
        submit(a)
        lat[i] = clock() - t0
    total = clock() - start
    if m.audit is not None:
        t0 = clock()
        m.audit.seal()  # what is left of the chain work is part of the cost
        total += clock() - t0
    gc.enable()
    us = lat / 1000.0
    return {
        "decisions_per_s": len(actions) / (total / 1e9),
        "p50_us": float(np.percentile(us, 50)),
        "p99_us": float(np.percentile(us, 99)),
        "p999_us": float(np.percentile(us, 99.9)),
        "max_us": float(us.max()),
    }


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--single", type=int, default=200_000, help="single calls per size")
    parser.add_argument("--batch", type=int, default=1_000_000, help="actions in the large batch")
    parser.add_argument("--traces", type=int, default=20_000, help="random Theorem 1 traces to check")
    parser.add_argument("--json", default=None, help="also write the results here")
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
        single = time_single(w.monitor, actions)
        audit, w.monitor.audit = w.monitor.audit, None
        single_off = time_single(w.monitor, actions)
        w.monitor.audit = audit
        batch = time_batches(w.monitor, b)
        ok = w.monitor.audit.verify().ok if w.monitor.audit is not None else None
        row = {
            "items": size,
            "setup_s": setup,
            "single": single,
            "single_no_audit": single_off,
            "batch": batch,
            "audit_records": len(w.monitor.audit) if w.monitor.audit else 0,
            "audit_verifies": ok,
        }
        rows.append(row)
        print(f"\nstore {size:>9,} items (setup {setup:.1f} s; audit {row['audit_records']:,} records, verifies: {ok})")
        print(
            f"  single call, audited   {single['decisions_per_s']:>12,.0f} decisions/s"
            f"   p50 {single['p50_us']:6.2f} us"
            f"   p99 {single['p99_us']:6.2f} us   p99.9 {single['p999_us']:7.2f} us   max {single['max_us']:9.1f} us"
            f"   | seed {SEED_CLAIM}"
        )
        print(
            f"  single call, no audit  {single_off['decisions_per_s']:>12,.0f} decisions/s   p50 "
            f"{single_off['p50_us']:6.2f} us   p99 {single_off['p99_us']:6.2f} us"
        )
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


if __name__ == "__main__":
    main()
