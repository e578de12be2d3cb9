"""Closure v1/v2 (Theorem 2c): E2 reproduced exactly; fast code equal to the paper's BFS on random graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rvu_pipelines.provenance.propagation as closure_module
from rvu_pipelines.provenance import (
    ProvenanceGraph,
    closure_sizes,
    closure_v1,
    closure_v2,
    reference_closure,
    reference_closure_sizes,
)
from rvu_pipelines.recovery.reproductions import E2_EXPECTED, reproduce_adapter_closure


def test_e2_reproduced_exactly(tmp_path: Path) -> None:
    result = reproduce_adapter_closure(tmp_path)
    assert {key: result[key] for key in E2_EXPECTED} == E2_EXPECTED
    assert result["v1_closure"] == ["b1", "b2", "b3"]
    # the +1 is adapter B's load entry (produced under B), exactly as in the paper's load_adapter
    assert result["v2_closure"] == ["b1", "b2", "b3", "load-b"]
    assert result["adapter_b_entries_in_closure"] == 3 and result["tainted_adapters"] == ["adapter-b"]
    assert result["theorem_2c_satisfied"] and not result["adapter_a_tainted"]


@st.composite
def graphs(draw, max_nodes: int = 40) -> ProvenanceGraph:
    """Forests with random branching and random adapter classes (some entries with none)."""
    n = draw(st.integers(min_value=1, max_value=max_nodes))
    m = draw(st.integers(min_value=1, max_value=5))
    parent = [-1]
    for i in range(1, n):
        parent.append(draw(st.one_of(st.just(-1), st.integers(min_value=max(0, i - 6), max_value=i - 1))))
    adapter = draw(st.lists(st.integers(min_value=-1, max_value=m - 1), min_size=n, max_size=n))
    return ProvenanceGraph(np.array(parent), np.array(adapter), m)


@settings(max_examples=120, deadline=None)
@given(graph=graphs(), data=st.data())
def test_closures_match_the_seed_bfs(graph: ProvenanceGraph, data) -> None:
    seeds = data.draw(st.lists(st.integers(min_value=0, max_value=graph.n - 1), min_size=1, max_size=3))
    depth = data.draw(st.integers(min_value=0, max_value=12))
    for adapter_aware, compute in ((False, closure_v1), (True, closure_v2)):
        result = compute(graph, seeds, depth)
        members, tainted = reference_closure(graph, seeds, depth, adapter_aware)
        assert set(result.members.tolist()) == members
        assert set(result.tainted_adapters.tolist()) == tainted
    assert set(closure_v1(graph, seeds, depth).members.tolist()) <= set(
        closure_v2(graph, seeds, depth).members.tolist()
    )


@settings(max_examples=120, deadline=None)
@given(graph=graphs(), radius=st.integers(min_value=0, max_value=4), light_limit=st.sampled_from([0, 1, 3, 64]))
def test_closure_sizes_equal_one_bfs_per_entry(graph: ProvenanceGraph, radius: int, light_limit: int) -> None:
    # light_limit 0/1/3 forces the shared ("heavy") union paths that only large graphs reach otherwise
    targets = np.arange(graph.n)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(closure_module, "LIGHT_LIMIT", light_limit)
        fast = closure_sizes(graph, targets, radius)
        threaded = closure_sizes(graph, targets, radius, workers=3)  # chunks share the whole-graph masks
    expected = reference_closure_sizes(graph, targets, radius).tolist()
    assert fast.tolist() == expected and threaded.tolist() == expected


def test_closure_sizes_on_a_larger_agent_shaped_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    n, m = 3000, 12
    parent = np.full(n, -1)
    adapter = np.full(n, -1)
    current = -1
    for i in range(1, n):
        if rng.random() < 0.05:
            current = int(rng.integers(-1, m))
            continue
        parent[i] = i - 1 if rng.random() < 0.8 else int(rng.integers(max(0, i - 20), i))
        if rng.random() < 0.03:
            current = int(min(m - 1, rng.zipf(1.5) - 1))
        adapter[i] = current
    graph = ProvenanceGraph(parent, adapter, m)
    targets = rng.choice(n, 300, replace=False)
    expected = reference_closure_sizes(graph, targets, 3)
    for limit in (0, 8, 64):
        monkeypatch.setattr(closure_module, "LIGHT_LIMIT", limit)
        assert np.array_equal(closure_sizes(graph, targets, 3), expected)
        assert np.array_equal(closure_sizes(graph, targets, 3, workers=4), expected)
    # above PARALLEL_MIN_TARGETS the default splits across the usable cores: same numbers as one thread
    monkeypatch.setattr(closure_module, "PARALLEL_MIN_TARGETS", 10)
    monkeypatch.setattr(closure_module, "usable_cores", lambda: 2)
    assert np.array_equal(closure_sizes(graph, targets, 3), expected)


def test_depth_bound_matches_the_seed_queue() -> None:
    chain = ProvenanceGraph(np.arange(-1, 14), np.full(15, -1), 0)
    result = closure_v1(chain, [0], max_depth=10)
    assert result.members.tolist() == list(range(11)) and result.depths.tolist() == list(range(11))
    # an adapter is tainted only when one of its entries is expanded (reached before the bound)
    adapter = np.full(15, -1)
    adapter[10] = 0
    adapter[14] = 0
    graph = ProvenanceGraph(np.arange(-1, 14), adapter, 1)
    bounded = closure_v2(graph, [0], max_depth=10)
    assert 14 not in bounded.members.tolist() and bounded.tainted_adapters.size == 0
    deeper = closure_v2(graph, [0], max_depth=11)
    assert 14 in deeper.members.tolist() and deeper.tainted_adapters.tolist() == [0]


def test_graph_rejects_bad_arrays() -> None:
    with pytest.raises(ValueError, match="earlier entry"):
        ProvenanceGraph(np.array([1, -1]), np.array([-1, -1]), 0)
    with pytest.raises(ValueError, match="adapter indices"):
        ProvenanceGraph(np.array([-1]), np.array([3]), 1)
    with pytest.raises(ValueError, match="seed indices"):
        closure_v2(ProvenanceGraph(np.array([-1]), np.array([-1]), 0), [5])
