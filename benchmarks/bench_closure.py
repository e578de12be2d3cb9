"""Closure + FROC risk + tiers at 10^4..10^6 entries: the seed's method vs networkx vs ours, side by side.

Run:  .venv/bin/python benchmarks/bench_closure.py            (10^4, 10^5, 10^6)
      .venv/bin/python benchmarks/bench_closure.py --sizes 10000000 --methods ours

Graphs are shaped like agent traces: episodes of ~20 entries (lognormal), each a root (user input)
followed by a parent chain with branching (80% previous entry, else an earlier entry of the episode);
70% of episodes load an adapter (an adapter_load entry under it, as in the seed), chosen with
power-law (Zipf s=1.1) popularity over n/1000 adapters, and switch adapter mid-episode with
probability --switch-rate per step. A few entries (1 per 10^5, at least 3) are contamination seeds;
adapters get an influence drawn from Beta(0.5, 2).

Methods, all computing the same thing (closure v2 with depth 10, R(e) for every closure entry with
|C({e})| at depth 3, and the tier actions):
- seed: seed 000 §3.3/§3.4 as its code does it, on SQLite: one SELECT per visited node
  (children, parent, adapter members), then compute_risk_score per entry (COUNT(*) + a depth-3
  BFS), then one UPDATE/INSERT per entry. We add indexes on parent_id and active_adapter_id that the
  seed's schema lacks (without them every child lookup is a full scan). Its FAISS rebuild is left out.
- networkx: the graph as entries + one hub node per adapter (entry-entry edges weight 1, entry-hub
  0.5, so an adapter hop costs 1), multi-source shortest paths with cutoff = depth; risk is one
  single-source search (cutoff 3) per entry. Graph construction is timed separately.
- ours: the library: load the graph from the DuckDB store, closure_v1 + closure_v2, compute_risk
  (exact closure_sizes), TierPlan + apply_tiers on the DuckDB store and the FAISS IndexIDMap.

A stage that would exceed --budget (alias --cap, default 60) seconds is stopped and extrapolated
linearly from the work done (nodes popped for a closure, entries scored for risk/tiers, sampled
uniformly); such numbers are marked "~". Ratios are printed twice: "MEASURED" only where the other
method finished within the cap (else "did not finish"), and "EXTRAPOLATED" on a separate line where
it did not. The last block names the largest size at which the seed's per-node BFS finished and the
measured ratio there, with the extrapolations for the larger sizes apart.
Quick:  .venv/bin/python benchmarks/bench_closure.py --sizes 10000 30000 100000 --methods seed ours --repeats 1
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_results import Row, add_results_dir_argument, record  # noqa: E402

from rvu_pipelines.provenance import DuckDBProvenanceStore, ProvenanceGraph, closure_v1, closure_v2  # noqa: E402
from rvu_pipelines.provenance.intsets import union_ints  # noqa: E402
from rvu_pipelines.recovery.froc import PAPER_POPULATION, FrocPolicy, Tier, compute_risk  # noqa: E402
from rvu_pipelines.recovery.tiers import TierPlan, apply_tiers  # noqa: E402
from rvu_pipelines.recovery.vector_index import VectorIndex  # noqa: E402

MAX_DEPTH = 10
RISK_DEPTH = 3
GOAL_AT_1M_S = 0.7  # the goal for closure + risk + tiers at 10^6 entries (median), quoted in README


def bench_policy() -> FrocPolicy:
    """The shipped policy with the paper's spread population (|V| = the whole store), as the seed's
    compute_risk_score divides by COUNT(*) of the store: the methods must compute the same R(e)."""
    return FrocPolicy.load().with_spread_population(PAPER_POPULATION)


# ------------------------------------------------------------------------------------ generator


@dataclass
class Trace:
    parent: np.ndarray
    adapter: np.ndarray
    n_adapters: int
    episodes: int
    episode_of: np.ndarray
    seeds: np.ndarray
    influence: np.ndarray

    @property
    def n(self) -> int:
        return int(self.parent.size)


def generate(n: int, *, switch_rate: float, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    n_adapters = max(16, n // 1000)
    popularity = 1.0 / np.arange(1, n_adapters + 1) ** 1.1
    popularity /= popularity.sum()
    sizes = np.clip(rng.lognormal(3.0, 0.6, size=n // 10 + 10).astype(np.int64), 3, 400)
    sizes = sizes[: int(np.searchsorted(np.cumsum(sizes), n)) + 1]
    sizes[-1] -= int(sizes.sum()) - n
    sizes = sizes[sizes > 0]
    episodes = sizes.size
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    episode_of = np.repeat(np.arange(episodes), sizes)
    offset = np.arange(n) - starts[episode_of]
    # parents: previous entry (80%) or a random earlier entry of the episode; roots have none
    earlier = starts[episode_of] + np.floor(rng.random(n) * np.maximum(offset, 1)).astype(np.int64)
    parent = np.where(rng.random(n) < 0.8, np.arange(n) - 1, earlier)
    parent[offset == 0] = -1
    parent[offset == 1] = starts[episode_of][offset == 1]  # the adapter load hangs off the root
    # adapters: 70% of episodes load one at offset 1 and may switch later; segments draw by popularity
    with_adapter = rng.random(episodes) < 0.7
    segment_start = (offset == 1) & with_adapter[episode_of]
    segment_start |= (offset >= 2) & with_adapter[episode_of] & (rng.random(n) < switch_rate)
    segment = np.cumsum(segment_start) - 1
    segment_adapter = rng.choice(n_adapters, size=int(segment_start.sum()), p=popularity)
    adapter = np.where(with_adapter[episode_of] & (offset >= 1), segment_adapter[np.maximum(segment, 0)], -1)
    n_seeds = max(3, n // 100_000)
    seeds = np.sort(rng.choice(n, size=n_seeds, replace=False))
    influence = rng.beta(0.5, 2.0, size=n_adapters)
    return Trace(parent.astype(np.int64), adapter.astype(np.int64), n_adapters, episodes, episode_of, seeds, influence)


# ------------------------------------------------------------------------------------ stores


def build_duckdb(trace: Trace, workdir: Path, dim: int) -> tuple[Path, Path, float]:
    """The DuckDB store + FAISS index of ``trace``; also the seconds ``bulk_load`` (the ingest) took."""
    store_path, index_path = workdir / f"ours_{trace.n}.duckdb", workdir / f"ours_{trace.n}.faiss"
    for path in (store_path, index_path):
        if path.exists():
            path.unlink()
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((trace.n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    contamination = np.zeros(trace.n)
    contamination[trace.seeds] = 1.0
    entry_ids = np.array([f"e{i:09d}" for i in range(trace.n)], dtype=object)
    adapter_ids = np.array([f"adapter-{i:06d}" for i in range(trace.n_adapters)], dtype=object)
    with DuckDBProvenanceStore.open(store_path) as store:
        started = time.perf_counter()
        store.bulk_load(
            entry_ids=entry_ids,
            parent_seq=trace.parent,
            adapter_seq=trace.adapter,
            contamination=contamination,
            adapter_ids=adapter_ids,
            influence=trace.influence,
            vectors=vectors,
            episode_ids=np.array([f"ep{e}" for e in trace.episode_of], dtype=object),
        )
        ingest = time.perf_counter() - started
        VectorIndex.open(index_path, store)  # builds and saves the index from the stored vectors
    return store_path, index_path, ingest


SEED_SCHEMA = """
CREATE TABLE provenance (
    entry_id TEXT PRIMARY KEY, episode_id TEXT, action_type TEXT, content TEXT, content_hash TEXT,
    parent_id TEXT, timestamp REAL, tainted INTEGER DEFAULT 0, purged INTEGER DEFAULT 0,
    active_adapter_id TEXT DEFAULT NULL);
CREATE TABLE adapter_provenance (adapter_id TEXT PRIMARY KEY, adapter_name TEXT NOT NULL, adapter_hash TEXT NOT NULL,
    source TEXT DEFAULT 'local', loaded_at REAL, unloaded_at REAL, fused INTEGER DEFAULT 0, risk_score REAL DEFAULT 0.0,
    tainted INTEGER DEFAULT 0, purged INTEGER DEFAULT 0, parent_adapter_id TEXT, episode_id TEXT);
CREATE TABLE quarantine (entry_id TEXT PRIMARY KEY, quarantined_at REAL, risk_score REAL, reason TEXT,
    restored INTEGER DEFAULT 0);
"""


def build_sqlite(trace: Trace, workdir: Path) -> Path:
    path = workdir / f"seed_{trace.n}.sqlite"
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    con.executescript(SEED_SCHEMA)
    con.execute("PRAGMA journal_mode=WAL")
    tainted = np.zeros(trace.n, dtype=np.int64)
    tainted[trace.seeds] = 1
    rows = (
        (
            f"e{i:09d}",
            f"ep{trace.episode_of[i]}",
            "tool_output",
            f"entry e{i:09d}",
            "",
            None if p < 0 else f"e{p:09d}",
            float(i),
            int(t),
            0,
            None if a < 0 else f"adapter-{a:06d}",
        )
        for i, p, a, t in zip(
            range(trace.n), trace.parent.tolist(), trace.adapter.tolist(), tainted.tolist(), strict=True
        )
    )
    con.executemany("INSERT INTO provenance VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
    con.executemany(
        "INSERT INTO adapter_provenance (adapter_id, adapter_name, adapter_hash) VALUES (?,?,?)",
        ((f"adapter-{a:06d}", f"adapter-{a:06d}", "") for a in range(trace.n_adapters)),
    )
    # not in the seed's schema; without them each lookup below is a full table scan
    con.execute("CREATE INDEX idx_parent ON provenance(parent_id)")
    con.execute("CREATE INDEX idx_adapter ON provenance(active_adapter_id)")
    con.commit()
    con.close()
    return path


# ------------------------------------------------------------------------------------ timing helpers


@dataclass
class Timing:
    seconds: float
    extrapolated: bool = False
    note: str = ""

    def __str__(self) -> str:
        text = f"{'~' if self.extrapolated else ''}{format_seconds(self.seconds)}"
        return text + (f" ({self.note})" if self.note else "")


def format_seconds(value: float) -> str:
    if value >= 1e5:
        return f"{value:.2e} s"
    if value >= 100:
        return f"{value:.0f} s"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1000:.1f} ms"


def measured_ratio(slow: Timing, fast: Timing) -> str:
    """The ratio only where the slow method finished within the cap; never an extrapolation."""
    if slow.extrapolated:
        return "did not finish (cap)"
    value = slow.seconds / max(fast.seconds, 1e-9)
    return f"{value:,.1f}x" if value < 100 else f"{value:,.0f}x"


def extrapolated_ratio(slow: Timing, fast: Timing) -> str:
    return f"~{slow.seconds / max(fast.seconds, 1e-9):,.0f}x" if slow.extrapolated else "measured"


# ------------------------------------------------------------------------------------ the seed's method


class SeedMethod:
    """seed 000's RVUv2Defense closure / risk / purge, node by node against SQLite."""

    def __init__(self, path: Path, budget: float) -> None:
        self.con = sqlite3.connect(path)
        self.budget = budget

    def _children(self, entry_id: str) -> list[str]:
        return [
            r[0]
            for r in self.con.execute("SELECT entry_id FROM provenance WHERE parent_id = ? AND purged = 0", (entry_id,))
        ]

    def _entry(self, entry_id: str) -> tuple | None:
        return self.con.execute(
            "SELECT entry_id, episode_id, action_type, content, content_hash, parent_id, timestamp, tainted, purged, "
            "active_adapter_id FROM provenance WHERE entry_id = ?",
            (entry_id,),
        ).fetchone()

    def _adapter_entries(self, adapter_id: str) -> list[str]:
        return [
            r[0]
            for r in self.con.execute(
                "SELECT entry_id FROM provenance WHERE active_adapter_id = ? AND purged = 0", (adapter_id,)
            )
        ]

    def closure(self, seeds: list[str], max_depth: int, deadline: float | None = None) -> tuple[set[str], int, bool]:
        """Returns (closure, nodes popped, finished)."""
        closure = set(seeds)
        queue = deque((s, 0) for s in seeds)
        tainted: set[str] = set()
        popped = 0
        while queue:
            if deadline is not None and popped % 256 == 0 and time.perf_counter() > deadline:
                return closure, popped, False
            current, depth = queue.popleft()
            popped += 1
            if depth >= max_depth:
                continue
            for child in self._children(current):
                if child not in closure:
                    closure.add(child)
                    queue.append((child, depth + 1))
            entry = self._entry(current)
            if entry and entry[5] and entry[5] not in closure:
                closure.add(entry[5])
                queue.append((entry[5], depth + 1))
            if entry and entry[9] and entry[9] not in tainted:
                tainted.add(entry[9])
                self.con.execute("UPDATE adapter_provenance SET tainted = 1 WHERE adapter_id = ?", (entry[9],))
                for member in self._adapter_entries(entry[9]):
                    if member not in closure:
                        closure.add(member)
                        queue.append((member, depth + 1))
        return closure, popped, True

    def risk(self, entry_id: str, influence: dict[str, float]) -> float:
        entry = self._entry(entry_id)
        p = 1.0 if entry[7] else 0.0
        i = influence.get(entry[9], 0.0) if entry[9] else 0.0
        total = self.con.execute("SELECT COUNT(*) FROM provenance WHERE purged = 0").fetchone()[0]
        size = len(self.closure([entry_id], RISK_DEPTH)[0])
        return 0.4 * p + 0.3 * min(1.0, i) + 0.3 * min(1.0, size / total)

    def apply(self, entry_id: str, tier: Tier, score: float) -> None:
        if tier == Tier.FLAG:
            self.con.execute("UPDATE provenance SET tainted = 1 WHERE entry_id = ?", (entry_id,))
        elif tier == Tier.QUARANTINE:
            self.con.execute(
                "INSERT OR REPLACE INTO quarantine (entry_id, quarantined_at, risk_score, reason, restored) "
                "VALUES (?, ?, ?, 'risk_scored_quarantine', 0)",
                (entry_id, time.time(), score),
            )
        elif tier in (Tier.PURGE, Tier.EVICT):
            entry = self._entry(entry_id)
            if entry and not entry[8]:
                self.con.execute("UPDATE provenance SET purged = 1, tainted = 1 WHERE entry_id = ?", (entry_id,))


def time_per_item(items: list, work, budget: float) -> tuple[float, int]:
    """Run ``work`` over ``items`` until done or ``budget`` seconds pass; (seconds, items done)."""
    start = time.perf_counter()
    done = 0
    for item in items:
        work(item)
        done += 1
        if time.perf_counter() - start > budget:
            break
    return time.perf_counter() - start, done


# ------------------------------------------------------------------------------------ runs


@dataclass
class SizeResult:
    n: int
    lines: list[str] = field(default_factory=list)


def run_ours(store_path: Path, index_path: Path, policy: FrocPolicy, seeds: np.ndarray) -> dict:
    gc.collect()
    t = {}
    start = time.perf_counter()
    with DuckDBProvenanceStore.open(store_path) as store:
        t["open store"] = time.perf_counter() - start
        mark = time.perf_counter()
        index = VectorIndex.open(index_path, store)
        t["open+reconcile index"] = time.perf_counter() - mark
        begin = time.perf_counter()
        graph = store.graph()
        contamination = store.contamination_scores()
        influence = store.adapter_influence()
        t["load graph"] = time.perf_counter() - begin
        mark = time.perf_counter()
        v1 = closure_v1(graph, seeds, MAX_DEPTH)
        v2 = closure_v2(graph, seeds, MAX_DEPTH)
        t["closure v1+v2"] = time.perf_counter() - mark
        mark = time.perf_counter()
        risk = compute_risk(graph, v2.members, contamination, influence, policy)
        t["risk"] = time.perf_counter() - mark
        mark = time.perf_counter()
        plan = TierPlan.from_risk(risk, graph, v2.tainted_adapters)
        plan = TierPlan(
            union_ints(plan.flag, seeds),
            plan.quarantine,
            plan.quarantine_risk,
            plan.purge,
            plan.evict_adapters,
            plan.tainted_adapters,
        )
        outcome = apply_tiers(store, index, plan, details={"benchmark": True})
        t["tiers"] = time.perf_counter() - mark
        total = time.perf_counter() - begin
        fresh = ProvenanceGraph(graph.parent.copy(), graph.adapter.copy(), graph.n_adapters)  # no cached CSR
        mark = time.perf_counter()
        v2_only = closure_v2(fresh, seeds, MAX_DEPTH)
        t["closure v2 alone (fresh graph)"] = time.perf_counter() - mark
        consistent = bool(np.array_equal(index.ids(), store.allowed_vector_seqs()))
    assert np.array_equal(v2_only.members, v2.members)
    return {
        "t": t,
        "total": total,
        "v1": v1,
        "v2": v2,
        "v2_only": v2_only,
        "risk": risk,
        "outcome": outcome,
        "consistent": consistent,
    }


def run_ours_isolated(store_path: Path, index_path: Path, seeds: np.ndarray, repeats: int) -> list[dict]:
    """Time ours in fresh processes, each on a fresh copy of the store and index (tiers mutate them)."""
    runs = []
    seeds_path = store_path.with_suffix(".seeds.npy")
    np.save(seeds_path, seeds)
    for repeat in range(repeats):
        store_copy = store_path.with_name(f"run{repeat}_{store_path.name}")
        index_copy = index_path.with_name(f"run{repeat}_{index_path.name}")
        shutil.copy(store_path, store_copy)
        shutil.copy(index_path, index_copy)
        os.sync()  # flush the copies now, so their write-back does not land inside the timed run
        out = subprocess.run(
            [sys.executable, __file__, "--ours-worker", str(store_copy), str(index_copy), str(seeds_path)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        store_copy.unlink()
        index_copy.unlink()
    seeds_path.unlink()
    return runs


def ours_worker(store_path: str, index_path: str, seeds_path: str) -> None:
    seeds = np.load(seeds_path)
    baseline = peak_rss_bytes()  # interpreter + libraries, before the store is opened
    result = run_ours(Path(store_path), Path(index_path), bench_policy(), seeds)
    risk = result["risk"]
    print(
        json.dumps(
            {
                "t": result["t"],
                "total": result["total"],
                "consistent": result["consistent"],
                "v2": int(result["v2"].size),
                "score_sum": float(risk.score.sum()),
                "tiers": risk.counts(),
                "rss_baseline": baseline,
                "rss_peak": peak_rss_bytes(),
            }
        )
    )


def peak_rss_bytes() -> int:
    """This process's peak resident set so far. VmHWM belongs to the address space, so it starts afresh at
    exec; ru_maxrss (the fallback off Linux) keeps the forking parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def run_networkx(trace: Trace, ours: dict, budget: float) -> dict:
    import networkx as nx

    gc.collect()
    start = time.perf_counter()
    graph = nx.Graph()
    graph.add_nodes_from(range(trace.n))
    children = np.flatnonzero(trace.parent >= 0)
    graph.add_weighted_edges_from(
        zip(children.tolist(), trace.parent[children].tolist(), [1.0] * children.size, strict=True)
    )
    linked = np.flatnonzero(trace.adapter >= 0)
    hubs = (trace.n + trace.adapter[linked]).tolist()
    graph.add_weighted_edges_from(zip(linked.tolist(), hubs, [0.5] * linked.size, strict=True))
    build = time.perf_counter() - start
    start = time.perf_counter()
    lengths = nx.multi_source_dijkstra_path_length(graph, set(trace.seeds.tolist()), cutoff=MAX_DEPTH)
    closure = {node for node in lengths if node < trace.n}
    closure_time = time.perf_counter() - start
    agrees = closure == set(ours["v2"].members.tolist())
    members = ours["v2"].members
    sample = np.random.default_rng(3).permutation(members)[:100_000].tolist()
    sizes = {}

    def one(entry: int) -> None:
        reach = nx.single_source_dijkstra_path_length(graph, entry, cutoff=RISK_DEPTH)
        sizes[entry] = sum(1 for node in reach if node < trace.n)

    spent, done = time_per_item(sample, one, budget)
    risk = Timing(
        spent / done * members.size,
        extrapolated=done < members.size,
        note=f"{done:,} of {members.size:,} entries scored" if done < members.size else "",
    )
    expected = dict(zip(ours["risk"].seqs.tolist(), ours["risk"].closure_size.tolist(), strict=True))
    risk_agrees = all(expected[e] == s for e, s in sizes.items())
    return {"build": build, "closure": Timing(closure_time), "risk": risk, "agrees": agrees and risk_agrees}


def run_seed(sqlite_path: Path, trace: Trace, ours: dict, budget: float) -> dict:
    gc.collect()
    method = SeedMethod(sqlite_path, budget)
    seeds = [f"e{s:09d}" for s in trace.seeds.tolist()]
    members = ours["v2"].members
    start = time.perf_counter()
    closure, popped, finished = method.closure(seeds, MAX_DEPTH, deadline=start + budget)
    spent = time.perf_counter() - start
    if finished:
        closure_timing = Timing(spent)
        agrees = {int(e[1:]) for e in closure} == set(members.tolist())
    else:
        closure_timing = Timing(spent / popped * members.size, True, f"{popped:,} of {members.size:,} nodes popped")
        agrees = None
    method.con.rollback()
    influence = {f"adapter-{a:06d}": float(v) for a, v in enumerate(trace.influence.tolist())}
    sample = np.random.default_rng(3).permutation(members)[:100_000].tolist()
    scores = {}

    def one(entry: int) -> None:
        scores[entry] = method.risk(f"e{entry:09d}", influence)

    spent, done = time_per_item(sample, one, budget)
    risk = Timing(
        spent / done * members.size,
        done < members.size,
        f"{done:,} of {members.size:,} entries scored" if done < members.size else "",
    )
    risk_table = ours["risk"]
    expected = dict(zip(risk_table.seqs.tolist(), risk_table.score.tolist(), strict=True))
    risk_agrees = all(abs(expected[e] - s) < 1e-9 for e, s in scores.items())
    tiers = dict(zip(risk_table.seqs.tolist(), risk_table.tier.tolist(), strict=True))

    def apply(entry: int) -> None:
        method.apply(f"e{entry:09d}", Tier(int(tiers[entry])), expected[entry])

    spent, done = time_per_item(sample, apply, budget)
    method.con.commit()
    tier_timing = Timing(
        spent / done * members.size,
        done < members.size,
        f"{done:,} of {members.size:,} entries" if done < members.size else "",
    )
    method.con.close()
    return {"closure": closure_timing, "risk": risk, "tiers": tier_timing, "agrees": agrees, "risk_agrees": risk_agrees}


def stage_profile(trace: Trace, median: dict, ingest: float) -> str:
    """Where the time of the median run goes, and its memory per entry (README's profile is this line)."""
    t = median["t"]
    stages = {
        "load graph": t["load graph"],
        "closure v1+v2": t["closure v1+v2"],
        "risk (|C(e)| + R + tier)": t["risk"],
        "tier writes (store + index)": t["tiers"],
    }
    total = sum(stages.values())
    parts = ", ".join(f"{k} {format_seconds(v)} ({v / total:.0%})" for k, v in stages.items())
    per_entry = (median["rss_peak"] - median["rss_baseline"]) / trace.n
    return (
        f"profile (median run): ingest (bulk_load, once per store) {format_seconds(ingest)}; recovery {parts}; "
        f"peak RSS {median['rss_peak'] / 2**20:,.0f} MiB, {per_entry:,.0f} bytes/entry above the "
        f"{median['rss_baseline'] / 2**20:,.0f} MiB of the interpreter and libraries"
    )


def report(
    trace: Trace, ours: dict, isolated: list[dict], seed: dict | None, nx_result: dict | None, ingest: float
) -> tuple[list[str], dict]:
    v1, v2, risk = ours["v1"], ours["v2"], ours["risk"]
    median = sorted(isolated, key=lambda run: run["total"])[len(isolated) // 2]
    t = median["t"]
    totals = [run["total"] for run in isolated]
    ours_closure = Timing(statistics.median(run["t"]["closure v2 alone (fresh graph)"] for run in isolated))
    ours_total = Timing(median["total"])
    same = all(
        run["v2"] == v2.size and abs(run["score_sum"] - float(risk.score.sum())) < 1e-6 and run["consistent"]
        for run in isolated
    )
    counts = risk.counts()
    lines = [
        f"\n=== n = {trace.n:,} entries ({trace.episodes:,} episodes, {trace.n_adapters:,} adapters, "
        f"{trace.seeds.size} seeds) ===",
        f"closure v1 {v1.size:,} | v2 {v2.size:,} ({v2.size / trace.n:.0%} of entries), tainted adapters "
        f"{v2.tainted_adapters.size:,} | tiers " + ", ".join(f"{k} {v:,}" for k, v in counts.items()),
        f"ours, median of {len(isolated)} fresh-process runs (totals "
        + ", ".join(format_seconds(x) for x in totals)
        + "), per stage: "
        + ", ".join(f"{k} {format_seconds(v)}" for k, v in t.items()),
        stage_profile(trace, median, ingest),
        f"ours: fresh-process runs agree with the in-process run and keep store and index consistent: {same}",
        f"ours: store and index consistent after tiers: {ours['consistent']}; changed "
        + ", ".join(f"{k} {v:,}" for k, v in ours["outcome"].counts().items()),
        f"{'method':<46}{'closure v2':>28}{'closure + risk + tiers':>40}",
    ]
    if seed:
        full = Timing(
            seed["closure"].seconds + seed["risk"].seconds + seed["tiers"].seconds,
            seed["closure"].extrapolated or seed["risk"].extrapolated or seed["tiers"].extrapolated,
        )
        lines.append(f"{'seed (SQLite, SELECT per node, per entry)':<46}{str(seed['closure']):>28}{str(full):>40}")
        lines.append(f"{'':<46}{'':>28}   risk {seed['risk']}")
        lines.append(f"{'':<46}{'':>28}   tiers {seed['tiers']}")
    if nx_result:
        full = Timing(nx_result["closure"].seconds + nx_result["risk"].seconds, nx_result["risk"].extrapolated)
        lines.append(
            f"{'networkx (shortest paths, hub per adapter)':<46}{str(nx_result['closure']):>28}"
            f"{str(full) + ' (no tiers)':>40}"
        )
        lines.append(
            f"{'':<46}{'(graph build ' + format_seconds(nx_result['build']) + ', not counted)':>28}"
            f"   risk {nx_result['risk']}"
        )
    lines.append(f"{'ours (numpy closure, exact sizes, DuckDB+FAISS)':<46}{str(ours_closure):>28}{str(ours_total):>40}")
    summary: dict = {"n": trace.n, "ours_closure": ours_closure, "ours_total": ours_total}
    if seed:
        full = Timing(
            seed["closure"].seconds + seed["risk"].seconds + seed["tiers"].seconds,
            seed["closure"].extrapolated or seed["risk"].extrapolated or seed["tiers"].extrapolated,
        )
        summary.update(seed_closure=seed["closure"], seed_full=full)
        lines.append(
            f"{'ratio seed / ours, MEASURED':<46}{measured_ratio(seed['closure'], ours_closure):>28}"
            f"{measured_ratio(full, ours_total):>40}"
        )
        if seed["closure"].extrapolated or full.extrapolated:
            lines.append(
                f"{'ratio seed / ours, EXTRAPOLATED (capped)':<46}"
                f"{extrapolated_ratio(seed['closure'], ours_closure):>28}{extrapolated_ratio(full, ours_total):>40}"
            )
        agree = "not checked (seed closure capped)" if seed["agrees"] is None else str(seed["agrees"])
        lines.append(
            f"  seed closure equals ours: {agree}; seed R(e) equals ours on every scored entry: {seed['risk_agrees']}"
        )
    if nx_result:
        full = Timing(nx_result["closure"].seconds + nx_result["risk"].seconds, nx_result["risk"].extrapolated)
        lines.append(
            f"{'ratio networkx / ours, MEASURED':<46}{measured_ratio(nx_result['closure'], ours_closure):>28}"
            f"{measured_ratio(full, ours_total) + ' (ours incl. tiers)':>40}"
        )
        if full.extrapolated:
            lines.append(
                f"{'ratio networkx / ours, EXTRAPOLATED (capped)':<46}{'':>28}"
                f"{extrapolated_ratio(full, ours_total) + ' (ours incl. tiers)':>40}"
            )
        lines.append(f"  networkx closure and |C({{e}})| equal ours: {nx_result['agrees']}")
        summary.update(nx_closure=nx_result["closure"], nx_full=full)
    return lines, summary


def seed_summary(rows: list[dict], cap: float) -> list[str]:
    """Side by side against the seed's per-node SQL BFS: measured where it finished within the cap,
    and, on a separate labelled line, the extrapolations where it did not."""
    rows = [r for r in rows if "seed_closure" in r]
    if not rows:
        return []
    lines = [f"\n=== seed per-node BFS (SQLite) vs ours, cap {cap:g} s per stage ==="]
    for stage, key, ours_key in (
        ("closure v2", "seed_closure", "ours_closure"),
        ("closure + risk + tiers", "seed_full", "ours_total"),
    ):
        done = [r for r in rows if not r[key].extrapolated]
        capped = [r for r in rows if r[key].extrapolated]
        if done:
            best = max(done, key=lambda r: r["n"])
            lines.append(
                f"{stage}, MEASURED (seed finished): largest n = {best['n']:,}: seed {best[key]} vs ours "
                f"{best[ours_key]} = {measured_ratio(best[key], best[ours_key])}; all finished sizes: "
                + ", ".join(f"n={r['n']:,} {measured_ratio(r[key], r[ours_key])}" for r in done)
            )
        else:
            lines.append(f"{stage}, MEASURED: the seed finished at none of the sizes run; run smaller --sizes")
        if capped:
            lines.append(
                f"{stage}, EXTRAPOLATED (seed stopped at the cap, linear in the work done): "
                + ", ".join(
                    f"n={r['n']:,} ~{r[key].seconds:,.0f} s, {extrapolated_ratio(r[key], r[ours_key])}" for r in capped
                )
            )
    return lines


def headline_rows(summaries: list[dict], cap: float, repeats: int) -> list[Row]:
    """The seed's method and networkx vs ours at each size, as printed (a baseline stopped at the cap is its
    labelled extrapolation), and the goal at 10^6."""
    ours = f"ours, median of {repeats} fresh processes"
    rows = []
    for summary in summaries:
        size = f"{summary['n']:,} entries"
        pairs = []
        if "seed_closure" in summary:
            pairs += [
                ("closure v2", "seed, SQLite per node", summary["seed_closure"], summary["ours_closure"]),
                ("closure + risk + tiers", "seed, SQLite per node", summary["seed_full"], summary["ours_total"]),
            ]
        if "nx_closure" in summary:
            pairs += [
                ("closure v2", "networkx", summary["nx_closure"], summary["ours_closure"]),
                ("closure + risk (+ tiers for ours)", "networkx", summary["nx_full"], summary["ours_total"]),
            ]
        for stage, label, base, new in pairs:
            label += f", ~EXTRAPOLATED past the {cap:g} s cap" if base.extrapolated else ""
            rows.append(Row(f"{stage}, {size}", label, base.seconds, ours, new.seconds, "s", False))
        if summary["n"] == 1_000_000:
            total = summary["ours_total"].seconds
            rows.append(Row(f"closure + risk + tiers, {size}", "goal", GOAL_AT_1M_S, ours, total, "s", False))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument(
        "--methods", nargs="+", default=["seed", "networkx", "ours"], choices=["seed", "networkx", "ours"]
    )
    parser.add_argument(
        "--budget",
        "--cap",
        type=float,
        default=60.0,
        help="seconds a seed/networkx stage may run; past it the stage stops and is extrapolated (labelled)",
    )
    parser.add_argument("--switch-rate", type=float, default=0.005, help="per-step probability of an adapter switch")
    parser.add_argument("--dim", type=int, default=16, help="vector dimension of the FAISS index")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=5, help="fresh-process runs of ours (median reported)")
    parser.add_argument("--ours-worker", nargs=3, metavar=("STORE", "INDEX", "SEEDS"), help=argparse.SUPPRESS)
    add_results_dir_argument(parser)
    args = parser.parse_args(argv)
    if args.ours_worker:
        ours_worker(*args.ours_worker)
        return 0
    policy = bench_policy()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rvu_bench_"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"benchmark: sizes {args.sizes}, switch rate {args.switch_rate}, budget {args.budget:g}s per capped stage, "
        f"vectors d={args.dim}, {os.cpu_count()} CPUs, workdir {workdir}"
    )
    summaries: list[dict] = []
    for n in args.sizes:
        started = time.perf_counter()
        trace = generate(n, switch_rate=args.switch_rate)
        store_path, index_path, ingest = build_duckdb(trace, workdir, args.dim)
        sqlite_path = build_sqlite(trace, workdir) if "seed" in args.methods else None
        setup = time.perf_counter() - started
        pristine = (
            store_path.with_name("pristine_" + store_path.name),
            index_path.with_name("pristine_" + index_path.name),
        )
        shutil.copy(store_path, pristine[0])
        shutil.copy(index_path, pristine[1])
        os.sync()
        ours = run_ours(store_path, index_path, policy, trace.seeds)  # in process: results for the cross-checks
        isolated = run_ours_isolated(pristine[0], pristine[1], trace.seeds, args.repeats)
        pristine[0].unlink()
        pristine[1].unlink()
        nx_result = run_networkx(trace, ours, args.budget) if "networkx" in args.methods else None
        seed = run_seed(sqlite_path, trace, ours, args.budget) if sqlite_path else None
        lines, summary = report(trace, ours, isolated, seed, nx_result, ingest)
        summaries.append(summary)
        for line in lines:
            print(line)
        print(f"(setup: generate + build stores {format_seconds(setup)})", flush=True)
        for path in (store_path, index_path, sqlite_path):
            if path is not None and path.exists():
                path.unlink()
    for line in seed_summary(summaries, args.budget):
        print(line)
    record(__file__, headline_rows(summaries, args.budget, args.repeats), args.results_dir, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
