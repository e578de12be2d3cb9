"""Contamination closure over the provenance graph: v1 (parent/child) and v2 (adapter-aware).

Seed 000 §3.3 (Theorem 2c) defines the v2 closure as a BFS from the contamination seed set K, depth-bounded
(``max_depth`` = 10), that follows each entry's children and parent and, for an entry produced under
adapter A, marks A tainted and adds *every* entry produced under A. v1 is the same BFS without the
adapter step. The paper's code runs one SQL SELECT per visited node; here the graph is two integer arrays
(``parent``, ``adapter``) and the BFS is level-synchronous over numpy arrays, so a closure over a
million entries costs a few array passes.

Depth semantics match the paper's queue exactly: seeds are at depth 0, a node first reached at depth d
is expanded only if d < max_depth, and reaching all entries of an adapter costs one hop. So the
closure is every entry within graph distance ``max_depth`` of a seed, where the graph has parent/child
edges plus an edge between any two entries of the same adapter; an adapter is tainted when one of its
entries is expanded (reached at depth < max_depth).

|C({e})| for many entries at once (the FROC risk's propagation term) is in :mod:`propagation`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from rvu_pipelines.provenance.intsets import csr_by_key, gather_rows, in_sorted, sorted_unique

DEFAULT_MAX_DEPTH = 10


@dataclass(frozen=True, eq=False)
class ProvenanceGraph:
    """The provenance DAG as arrays indexed by entry sequence number (0..n-1).

    ``parent[i]`` is the parent's index or -1; parents always come first (``parent[i] < i``), so the
    parent edges form a forest. ``adapter[i]`` is the index of the adapter active when entry i was
    produced, or -1.
    """

    parent: np.ndarray
    adapter: np.ndarray
    n_adapters: int

    def __post_init__(self) -> None:
        parent = np.ascontiguousarray(self.parent, dtype=np.int64)
        adapter = np.ascontiguousarray(self.adapter, dtype=np.int64)
        if parent.shape != adapter.shape or parent.ndim != 1:
            raise ValueError("parent and adapter must be 1-D arrays of the same length")
        if parent.size and (parent.min() < -1 or np.any(parent >= np.arange(parent.size))):
            raise ValueError("every parent must be -1 or an earlier entry (parent[i] < i)")
        n_adapters = int(self.n_adapters)
        if adapter.size and (adapter.min() < -1 or adapter.max() >= n_adapters):
            raise ValueError("adapter indices must be -1 or in [0, n_adapters)")
        object.__setattr__(self, "parent", parent)
        object.__setattr__(self, "adapter", adapter)
        object.__setattr__(self, "n_adapters", n_adapters)

    @property
    def n(self) -> int:
        return int(self.parent.size)

    @cached_property
    def children_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, children) of every entry, built once: the closure and propagation walk it."""
        return csr_by_key(self.parent, self.n)

    @cached_property
    def members_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, entries) of every adapter, built once."""
        return csr_by_key(self.adapter, self.n_adapters)

    @cached_property
    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(child, parent) index arrays of every parent edge."""
        child = np.flatnonzero(self.parent >= 0)
        return child, self.parent[child]

    @cached_property
    def adapter_sizes(self) -> np.ndarray:
        return np.diff(self.members_csr[0])

    def children_of(self, node: int) -> np.ndarray:
        indptr, values = self.children_csr
        return values[indptr[node] : indptr[node + 1]]

    def members_of(self, adapter: int) -> np.ndarray:
        indptr, values = self.members_csr
        return values[indptr[adapter] : indptr[adapter + 1]]


@dataclass(frozen=True)
class ClosureResult:
    """A closure: its members (sorted entry indices), the depth each was reached at, tainted adapters."""

    members: np.ndarray
    depths: np.ndarray
    tainted_adapters: np.ndarray
    seeds: np.ndarray
    max_depth: int
    adapter_aware: bool

    @property
    def size(self) -> int:
        return int(self.members.size)

    def contains(self, nodes: np.ndarray) -> np.ndarray:
        return in_sorted(self.members, np.asarray(nodes, dtype=np.int64))


def _check_seeds(graph: ProvenanceGraph, seeds: np.ndarray | list[int]) -> np.ndarray:
    seeds = sorted_unique(np.asarray(seeds, dtype=np.int64))
    if seeds.size and (seeds[0] < 0 or seeds[-1] >= graph.n):
        raise ValueError("seed indices must be in [0, n)")
    return seeds


def _closure(
    graph: ProvenanceGraph, seeds: np.ndarray | list[int], max_depth: int, adapter_aware: bool
) -> ClosureResult:
    if max_depth < 0:
        raise ValueError("max_depth must be >= 0")
    seeds = _check_seeds(graph, seeds)
    depth_of = np.full(graph.n, -1, dtype=np.int32)
    depth_of[seeds] = 0
    expanded = np.zeros(graph.n_adapters, dtype=bool)
    stamp = np.full(graph.n, -1, dtype=np.int64)
    children_indptr, children = graph.children_csr
    members_indptr, members = graph.members_csr
    frontier = seeds
    depth = 0
    while frontier.size and depth < max_depth:
        parents = graph.parent[frontier]
        parts = [parents[parents >= 0], gather_rows(children_indptr, children, frontier)[1]]
        if adapter_aware:
            adapters = graph.adapter[frontier]
            adapters = sorted_unique(adapters[adapters >= 0])
            adapters = adapters[~expanded[adapters]]
            expanded[adapters] = True
            parts.append(gather_rows(members_indptr, members, adapters)[1])
        candidates = np.concatenate(parts)
        candidates = candidates[depth_of[candidates] < 0]
        # deduplicate in O(k): the last write of each node wins, keep exactly that occurrence
        stamp[candidates] = np.arange(candidates.size)
        candidates = candidates[stamp[candidates] == np.arange(candidates.size)]
        depth += 1
        depth_of[candidates] = depth
        frontier = candidates
    reached = np.flatnonzero(depth_of >= 0)
    return ClosureResult(
        members=reached.astype(np.int64),
        depths=depth_of[reached].astype(np.int32),
        tainted_adapters=np.flatnonzero(expanded).astype(np.int64),
        seeds=seeds,
        max_depth=max_depth,
        adapter_aware=adapter_aware,
    )


def closure_v1(
    graph: ProvenanceGraph, seeds: np.ndarray | list[int], max_depth: int = DEFAULT_MAX_DEPTH
) -> ClosureResult:
    """v1 closure: parent and child edges only (the RVU v1 baseline E2 compares against)."""
    return _closure(graph, seeds, max_depth, adapter_aware=False)


def closure_v2(
    graph: ProvenanceGraph, seeds: np.ndarray | list[int], max_depth: int = DEFAULT_MAX_DEPTH
) -> ClosureResult:
    """v2 adapter-aware closure (Theorem 2c): v1 plus every entry of each expanded adapter."""
    return _closure(graph, seeds, max_depth, adapter_aware=True)


def reference_closure(
    graph: ProvenanceGraph,
    seeds: list[int] | np.ndarray,
    max_depth: int = DEFAULT_MAX_DEPTH,
    adapter_aware: bool = True,
) -> tuple[set[int], set[int]]:
    """The paper's queue BFS, node by node, in plain Python: the specification the fast code must match."""
    closure: set[int] = {int(s) for s in seeds}
    queue: deque[tuple[int, int]] = deque((s, 0) for s in sorted(closure))
    tainted: set[int] = set()
    while queue:
        current, depth = queue.popleft()
        if depth >= max_depth:
            continue
        for child in graph.children_of(current).tolist():
            if child not in closure:
                closure.add(child)
                queue.append((child, depth + 1))
        parent = int(graph.parent[current])
        if parent >= 0 and parent not in closure:
            closure.add(parent)
            queue.append((parent, depth + 1))
        adapter = int(graph.adapter[current])
        if adapter_aware and adapter >= 0 and adapter not in tainted:
            tainted.add(adapter)
            for member in graph.members_of(adapter).tolist():
                if member not in closure:
                    closure.add(member)
                    queue.append((member, depth + 1))
    return closure, tainted


def reference_closure_sizes(graph: ProvenanceGraph, targets: np.ndarray | list[int], radius: int = 3) -> np.ndarray:
    """One BFS per target (the paper's way): the oracle :func:`closure_sizes` is tested against."""
    return np.array(
        [len(reference_closure(graph, [int(t)], radius)[0]) for t in np.asarray(targets).tolist()], dtype=np.int64
    )
