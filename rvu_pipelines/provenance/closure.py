"""Contamination closure over the provenance graph: v1 (parent/child) and v2 (adapter-aware).

Seed 000 §3.3 (Theorem 2c) defines the v2 closure as a BFS from the seed set K, depth-bounded
(``max_depth`` = 10), that follows each entry's children and parent and, for an entry produced under
adapter A, marks A tainted and adds *every* entry produced under A. v1 is the same BFS without the
adapter step. The seed runs one SQL SELECT per visited node; here the graph is two integer arrays
(``parent``, ``adapter``) and the BFS is level-synchronous over numpy arrays, so a closure over a
million entries costs a few array passes.

Depth semantics match the seed's queue exactly: seeds are at depth 0, a node first reached at depth d
is expanded only if d < max_depth, and reaching all entries of an adapter costs one hop. So the
closure is every entry within graph distance ``max_depth`` of a seed, where the graph has parent/child
edges plus an edge between any two entries of the same adapter; an adapter is tainted when one of its
entries is expanded (reached at depth < max_depth).

The FROC risk needs |C({e})| (depth 3) for *every* entry of the closure. Doing one BFS per entry is
quadratic when adapters are large (each BFS holds the whole adapter). :func:`closure_sizes` computes
the same numbers exactly without per-entry BFS, by decomposing each ball into whole adapter classes
plus a "loose" fringe (see its docstring); tests compare it with the per-entry BFS on random graphs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import cached_property

import numpy as np

DEFAULT_MAX_DEPTH = 10


def _csr(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of node indices grouped by ``keys`` (entries with key < 0 are left out)."""
    nodes = np.flatnonzero(keys >= 0)
    order = np.argsort(keys[nodes], kind="stable")
    values = nodes[order].astype(np.int64)
    counts = np.bincount(keys[nodes], minlength=size)
    indptr = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, values


def _gather_positions(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row in ``rows``: the positions of its CSR values. Returns (position in ``rows``, index)."""
    starts = indptr[rows]
    lengths = indptr[rows + 1] - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(rows.size, dtype=np.int64), lengths)
    ends = np.cumsum(lengths)
    return owner, np.arange(total, dtype=np.int64) + (starts - (ends - lengths))[owner]


def _gather(indptr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row in ``rows``: its CSR values. Returns (position in ``rows``, value) pairs."""
    owner, positions = _gather_positions(indptr, rows)
    return owner, values[positions]


def _unique(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values. numpy 2.4's ``np.unique`` (and ``union1d``) take a hash path that is
    50-100x slower than a sort on these arrays (0.6-0.9 s for 10^6 ints); every set operation in the
    recovery path goes through this instead."""
    ordered = np.sort(values)
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def _unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values and, for each input, the index of its value among them."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    new = np.ones(ordered.size, dtype=bool)
    if ordered.size > 1:
        np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    group = np.cumsum(new) - 1
    inverse = np.empty(values.size, dtype=np.int64)
    inverse[order] = group
    return ordered[new], inverse


def _unique_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    distinct, inverse = _unique_inverse(values)
    return distinct, np.bincount(inverse, minlength=distinct.size).astype(np.int64)


def _unique_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of a 2-D integer table and, for each row, the index of its distinct row."""
    if table.shape[0] == 0:
        return table, np.zeros(0, dtype=np.int64)
    order = np.lexsort(table.T[::-1])
    ordered = table[order]
    new = np.ones(ordered.shape[0], dtype=bool)
    new[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    group = np.cumsum(new) - 1
    inverse = np.empty(table.shape[0], dtype=np.int64)
    inverse[order] = group
    return ordered[new], inverse


def unique_ints(values: np.ndarray | list[int]) -> np.ndarray:
    """Sorted distinct int64 values (fast; see ``_unique``)."""
    return _unique(np.asarray(values, dtype=np.int64).ravel())


def union_ints(*arrays: np.ndarray) -> np.ndarray:
    """Sorted union of int arrays."""
    return unique_ints(np.concatenate([np.asarray(a, dtype=np.int64).ravel() for a in arrays]))


def _in_sorted(sorted_codes: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Boolean mask: which ``queries`` occur in the sorted array ``sorted_codes``."""
    if sorted_codes.size == 0 or queries.size == 0:
        return np.zeros(queries.shape, dtype=bool)
    positions = np.searchsorted(sorted_codes, queries)
    positions[positions == sorted_codes.size] = 0
    return sorted_codes[positions] == queries


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
    def _children(self) -> tuple[np.ndarray, np.ndarray]:
        return _csr(self.parent, self.n)

    @cached_property
    def _members(self) -> tuple[np.ndarray, np.ndarray]:
        return _csr(self.adapter, self.n_adapters)

    @cached_property
    def _edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(child, parent) index arrays of every parent edge."""
        child = np.flatnonzero(self.parent >= 0)
        return child, self.parent[child]

    @cached_property
    def adapter_sizes(self) -> np.ndarray:
        return np.diff(self._members[0])

    def children_of(self, node: int) -> np.ndarray:
        indptr, values = self._children
        return values[indptr[node]:indptr[node + 1]]

    def members_of(self, adapter: int) -> np.ndarray:
        indptr, values = self._members
        return values[indptr[adapter]:indptr[adapter + 1]]


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
        return _in_sorted(self.members, np.asarray(nodes, dtype=np.int64))


def _check_seeds(graph: ProvenanceGraph, seeds: np.ndarray | list[int]) -> np.ndarray:
    seeds = _unique(np.asarray(seeds, dtype=np.int64))
    if seeds.size and (seeds[0] < 0 or seeds[-1] >= graph.n):
        raise ValueError("seed indices must be in [0, n)")
    return seeds


def _closure(graph: ProvenanceGraph, seeds: np.ndarray | list[int], max_depth: int, adapter_aware: bool) -> ClosureResult:
    if max_depth < 0:
        raise ValueError("max_depth must be >= 0")
    seeds = _check_seeds(graph, seeds)
    depth_of = np.full(graph.n, -1, dtype=np.int32)
    depth_of[seeds] = 0
    expanded = np.zeros(graph.n_adapters, dtype=bool)
    stamp = np.full(graph.n, -1, dtype=np.int64)
    children_indptr, children = graph._children
    members_indptr, members = graph._members
    frontier = seeds
    depth = 0
    while frontier.size and depth < max_depth:
        parents = graph.parent[frontier]
        parts = [parents[parents >= 0], _gather(children_indptr, children, frontier)[1]]
        if adapter_aware:
            adapters = graph.adapter[frontier]
            adapters = _unique(adapters[adapters >= 0])
            adapters = adapters[~expanded[adapters]]
            expanded[adapters] = True
            parts.append(_gather(members_indptr, members, adapters)[1])
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


def closure_v1(graph: ProvenanceGraph, seeds: np.ndarray | list[int], max_depth: int = DEFAULT_MAX_DEPTH) -> ClosureResult:
    """v1 closure: parent and child edges only (the RVU v1 baseline E2 compares against)."""
    return _closure(graph, seeds, max_depth, adapter_aware=False)


def closure_v2(graph: ProvenanceGraph, seeds: np.ndarray | list[int], max_depth: int = DEFAULT_MAX_DEPTH) -> ClosureResult:
    """v2 adapter-aware closure (Theorem 2c): v1 plus every entry of each expanded adapter."""
    return _closure(graph, seeds, max_depth, adapter_aware=True)


def reference_closure(
    graph: ProvenanceGraph, seeds: list[int] | np.ndarray, max_depth: int = DEFAULT_MAX_DEPTH, adapter_aware: bool = True
) -> tuple[set[int], set[int]]:
    """The seed's queue BFS, node by node, in plain Python: the specification the fast code must match."""
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


# --------------------------------------------------------------------------------------------------
# |C({e})| for many e at once
# --------------------------------------------------------------------------------------------------


def _tree_ball_sizes(graph: ProvenanceGraph, targets: np.ndarray, radius: int) -> np.ndarray:
    """|B_T(e, r)|: entries within ``radius`` parent/child steps of each target (closed form on a forest).

    With D_j(v) the number of descendants exactly j levels below v and S_k = D_0 + ... + D_k, the ball
    is S_r(e) plus, for each ancestor a_k (k = 1..r), S_{r-k}(a_k) - S_{r-k-1}(a_{k-1}): the ancestor's
    subtree within the remaining budget, minus the branch we came up through.
    """
    n = graph.n
    parent = graph.parent
    child = np.flatnonzero(parent >= 0)
    child_parent = parent[child]
    cumulative = [np.ones(n, dtype=np.int64)]  # cumulative[k] = S_k
    level = cumulative[0]
    for _ in range(radius):
        level = np.bincount(child_parent, weights=level[child], minlength=n).astype(np.int64)
        cumulative.append(cumulative[-1] + level)

    def s(k: int, nodes: np.ndarray) -> np.ndarray:
        return cumulative[k][nodes] if k >= 0 else np.zeros(nodes.size, dtype=np.int64)

    sizes = s(radius, targets).copy()
    below = targets
    above = parent[targets]
    alive = above >= 0
    for k in range(1, radius + 1):
        if not alive.any():
            break
        idx = np.flatnonzero(alive)
        sizes[idx] += s(radius - k, above[idx]) - s(radius - k - 1, below[idx])
        below = np.where(alive, above, below)
        above = np.where(alive, parent[np.maximum(above, 0)], -1)
        alive = alive & (above >= 0)
    return sizes


def _within_mask(graph: ProvenanceGraph, base: np.ndarray, radius: int) -> np.ndarray:
    """Nodes with a ``base`` node within ``radius`` parent/child steps."""
    child, par = graph._edges
    mask = base.copy()
    for _ in range(radius):
        grown = mask.copy()
        grown[child] |= mask[par]  # parent in mask
        grown[par[mask[child]]] = True  # some child in mask
        mask = grown
    return mask


def _pure_mask(graph: ProvenanceGraph, radius: int) -> np.ndarray:
    """Nodes whose whole tree ball of ``radius`` lies inside their own adapter class."""
    parent, adapter = graph.parent, graph.adapter
    has_parent = parent >= 0
    parent_same = np.ones(graph.n, dtype=bool)
    parent_same[has_parent] = adapter[parent[has_parent]] == adapter[has_parent]
    odd_child = np.zeros(graph.n, dtype=bool)
    differs = has_parent & ~parent_same
    odd_child[parent[differs]] = True
    same_neighbours = (adapter >= 0) & parent_same & ~odd_child
    pure = adapter >= 0
    for _ in range(radius):
        bad = ~pure
        bad_child = np.zeros(graph.n, dtype=bool)
        bad_child[parent[has_parent & bad]] = True
        bad_parent = np.zeros(graph.n, dtype=bool)
        bad_parent[has_parent] = bad[parent[has_parent]]
        pure = same_neighbours & ~bad_child & ~bad_parent
    return pure


def _single_class_radius3(graph: ProvenanceGraph) -> np.ndarray:
    """Classed nodes e with |C_3({e})| = |Ext(c(e), 2)| exactly (the common case inside an episode).

    Holds when every classed node within 2 tree steps has e's class and no path e - u - w has both
    u and w unclassed: then each node within 3 steps is in c(e), its fringe F1 or F2 (see
    :func:`_extensions`), so the tree ball adds nothing to Ext(c(e), 2).
    """
    adapter = graph.adapter
    n = graph.n
    child, par = graph._edges
    children_indptr, children = graph._children
    has_children = np.flatnonzero(np.diff(children_indptr) > 0)
    starts = children_indptr[:-1][has_children]

    def spread(values: np.ndarray, reduce) -> np.ndarray:
        out = values.copy()
        out[child] = reduce(out[child], values[par])
        if children.size:
            out[has_children] = reduce(out[has_children], reduce.reduceat(values[children], starts))
        return out

    # classes met in each closed neighbourhood, as min and max (unclassed nodes contribute nothing)
    classes = adapter.astype(np.int32)
    classed = classes >= 0
    low = spread(np.where(classed, classes, np.iinfo(np.int32).max).astype(np.int32), np.minimum)
    high = spread(classes, np.maximum)
    # "bad": a classed node next to another class, or an unclassed node bridging two classes
    bad = np.where(classed, low != high, (low != high) & (high >= 0))
    bad_near = bad.copy()
    bad_near[child] |= bad[par]
    bad_near[par[bad[child]]] = True
    single = classed & ~bad_near
    # and no unclassed node next to e that itself has an unclassed neighbour
    unclassed = ~classed
    unclassed_neighbours = np.bincount(par[unclassed[child]], minlength=n)
    unclassed_neighbours[child] += unclassed[par]
    risky_hub = unclassed & (unclassed_neighbours >= 1)
    risky = np.zeros(n, dtype=bool)
    risky[child] = risky_hub[par]
    risky[par[risky_hub[child]]] = True
    return single & ~risky


def _tree_ball_pairs(graph: ProvenanceGraph, targets: np.ndarray, radius: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(target position, node, distance) for every node within ``radius`` tree steps of each target."""
    children_indptr, children = graph._children
    owner = np.arange(targets.size, dtype=np.int64)
    node = targets.astype(np.int64)
    prev = np.full(targets.size, -1, dtype=np.int64)
    owners, nodes, dists = [owner], [node], [np.zeros(targets.size, dtype=np.int8)]
    for distance in range(1, radius + 1):
        up = graph.parent[node]
        keep = (up >= 0) & (up != prev)
        child_owner, child = _gather(children_indptr, children, node)
        keep_child = child != prev[child_owner]
        next_owner = np.concatenate([owner[keep], owner[child_owner[keep_child]]])
        next_node = np.concatenate([up[keep], child[keep_child]])
        next_prev = np.concatenate([node[keep], node[child_owner[keep_child]]])
        owner, node, prev = next_owner, next_node, next_prev
        owners.append(owner)
        nodes.append(node)
        dists.append(np.full(owner.size, distance, dtype=np.int8))
    return np.concatenate(owners), np.concatenate(nodes), np.concatenate(dists)


LIGHT_LIMIT = 64  # extensions with more whole classes + loose entries than this are "heavy"


@dataclass
class _Extensions:
    """Ext(K, s) = entries within s steps of adapter class K, stored as whole classes + loose entries."""

    ccls_codes: np.ndarray  # sorted ext_id * m + class for every whole class in Ext
    ccls_ptr: np.ndarray  # CSR over ext ids into ccls_classes
    ccls_classes: np.ndarray
    lse_codes: np.ndarray  # sorted ext_id * n + node for every loose node in Ext
    lse_ptr: np.ndarray  # CSR over ext ids into lse_nodes
    lse_nodes: np.ndarray
    hist_codes: np.ndarray  # sorted ext_id * m + class of loose nodes, with counts
    hist_counts: np.ndarray
    whole_sizes: np.ndarray  # total size of the whole classes of each ext
    sizes: np.ndarray  # |Ext|

    @property
    def n_loose(self) -> np.ndarray:
        return np.diff(self.lse_ptr)

    @property
    def n_whole(self) -> np.ndarray:
        return np.diff(self.ccls_ptr)


def _lookup(sorted_codes: np.ndarray, values: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """values[i] where sorted_codes[i] == code, else 0."""
    if sorted_codes.size == 0 or codes.size == 0:
        return np.zeros(codes.size, dtype=np.int64)
    positions = np.searchsorted(sorted_codes, codes)
    positions[positions == sorted_codes.size] = 0
    return np.where(sorted_codes[positions] == codes, values[positions], 0)


def _extensions(graph: ProvenanceGraph, ext_codes: np.ndarray) -> _Extensions:
    """Whole classes and loose entries of Ext(K, s), s in {0, 1, 2}, for each sorted code K * 3 + s.

    Ext(K,0) = K. Ext(K,1) = K + F1(K), F1 = tree neighbours of K outside K. Ext(K,2) = K + F1 + F2 +
    every class met in F1, with F2 = tree neighbours of F1 outside K and F1.
    """
    n, m = graph.n, graph.n_adapters
    parent, adapter = graph.parent, graph.adapter
    children_indptr, children = graph._children
    n_ext = ext_codes.size
    ext_class, ext_budget = ext_codes // 3, ext_codes % 3

    def ext_ids(classes: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
        codes = classes * 3 + budget
        positions = np.searchsorted(ext_codes, codes)
        positions[positions == n_ext] = 0
        ok = (ext_codes[positions] == codes) if n_ext else np.zeros(codes.size, dtype=bool)
        return positions[ok], ok

    # F1 of every class at once, from the tree edges that cross a class boundary
    child = np.flatnonzero(parent >= 0)
    par = parent[child]
    child_class, parent_class = adapter[child], adapter[par]
    cross = child_class != parent_class
    from_child = cross & (child_class >= 0)
    from_parent = cross & (parent_class >= 0)
    edge_class = np.concatenate([child_class[from_child], parent_class[from_parent]])
    edge_node = np.concatenate([par[from_child], child[from_parent]])
    f1_parts_owner, f1_parts_node = [], []
    for budget in (1, 2):
        ids, ok = ext_ids(edge_class, budget)
        f1_parts_owner.append(ids)
        f1_parts_node.append(edge_node[ok])
    f1_codes = _unique(np.concatenate(f1_parts_owner) * n + np.concatenate(f1_parts_node))
    f1_owner, f1_node = f1_codes // n, f1_codes % n

    # F2: tree neighbours of F1 entries (budget-2 extensions), outside K and F1
    two = ext_budget[f1_owner] == 2
    g_owner, g_node = f1_owner[two], f1_node[two]
    up = parent[g_node]
    has_up = up >= 0
    c_owner, c_node = _gather(children_indptr, children, g_node)
    n_owner = np.concatenate([g_owner[has_up], g_owner[c_owner]])
    n_node = np.concatenate([up[has_up], c_node])
    keep = adapter[n_node] != ext_class[n_owner]
    f2_codes = _unique(n_owner[keep] * n + n_node[keep])
    f2_codes = f2_codes[~_in_sorted(f1_codes, f2_codes)]

    # whole classes: K itself, plus (budget 2) every class met in F1
    f1_classed = two & (adapter[f1_node] >= 0)
    ccls_codes = _unique(np.concatenate([np.arange(n_ext, dtype=np.int64) * m + ext_class,
                                         f1_owner[f1_classed] * m + adapter[f1_node[f1_classed]]]))
    # loose entries: F1 and F2 minus entries of whole classes
    lse_codes = np.concatenate([f1_codes, f2_codes])
    lse_owner, lse_node = lse_codes // n, lse_codes % n
    classed = adapter[lse_node] >= 0
    in_whole = np.zeros(lse_codes.size, dtype=bool)
    in_whole[classed] = _in_sorted(ccls_codes, lse_owner[classed] * m + adapter[lse_node[classed]])
    lse_codes = np.sort(lse_codes[~in_whole])
    lse_owner, lse_node = lse_codes // n, lse_codes % n

    lse_ptr = np.zeros(n_ext + 1, dtype=np.int64)
    np.cumsum(np.bincount(lse_owner, minlength=n_ext), out=lse_ptr[1:])
    ccls_owner, ccls_classes = ccls_codes // m, ccls_codes % m
    ccls_ptr = np.zeros(n_ext + 1, dtype=np.int64)
    np.cumsum(np.bincount(ccls_owner, minlength=n_ext), out=ccls_ptr[1:])
    classed = adapter[lse_node] >= 0
    hist_codes, hist_counts = _unique_counts(lse_owner[classed] * m + adapter[lse_node[classed]])
    whole = np.bincount(ccls_owner, weights=graph.adapter_sizes[ccls_classes], minlength=n_ext).astype(np.int64)
    return _Extensions(ccls_codes, ccls_ptr, ccls_classes, lse_codes, lse_ptr, lse_node, hist_codes, hist_counts,
                       whole, whole + np.diff(lse_ptr))


class _HeavyUnion:
    """|Ext(e1) u ... u Ext(ek)| for each key (a set of extension ids), plus membership queries.

    With W the union of the extensions' whole classes and L the union of their loose entries,
    |U| = sum_{K in W} |K| + |L minus entries of W|. The largest extension (the "base") is taken as is;
    the others add their whole classes the base lacks, their loose entries minus those in W (via class
    histograms), and entries loose in two or more extensions are subtracted once per extra copy. Those
    shared entries come from an inverted index (entry -> extensions holding it), so a key costs what
    its overlaps cost, not what its sets hold; no large set is materialised per key.
    """

    def __init__(self, graph: ProvenanceGraph, ext: _Extensions, keys: np.ndarray) -> None:
        n, m = graph.n, graph.n_adapters
        adapter = graph.adapter
        self.ext, self.n, self.m = ext, n, m
        n_keys = keys.shape[0]
        n_ext = ext.sizes.size
        ki_key, ki_slot = np.nonzero(keys >= 0)
        ki_ext = keys[ki_key, ki_slot]  # sorted by key, then ext (rows of ``keys`` are sorted)
        self.length = np.bincount(ki_key, minlength=n_keys)
        self.item_ptr = np.zeros(n_keys + 1, dtype=np.int64)
        np.cumsum(self.length, out=self.item_ptr[1:])
        self.item_ext = ki_ext
        order = np.lexsort((ki_ext, -ext.n_loose[ki_ext], ki_key))  # per key: most loose entries first
        o_key, o_ext = ki_key[order], ki_ext[order]
        is_base = np.ones(o_key.size, dtype=bool)
        is_base[1:] = o_key[1:] != o_key[:-1]
        self.base = np.full(n_keys, -1, dtype=np.int64)
        self.base[o_key[is_base]] = o_ext[is_base]
        has_base = self.base >= 0
        base0 = np.maximum(self.base, 0)
        sizes = np.where(has_base, ext.sizes[base0], 0)
        other_key, other_ext = o_key[~is_base], o_ext[~is_base]

        # whole classes the other extensions add (and the base's loose entries they swallow)
        oc_owner, oc_class = _gather(ext.ccls_ptr, ext.ccls_classes, other_ext)
        oc_key = other_key[oc_owner]
        fresh = ~_in_sorted(ext.ccls_codes, base0[oc_key] * m + oc_class)
        extra_c = _unique(oc_key[fresh] * m + oc_class[fresh])
        ec_key, ec_class = extra_c // m, extra_c % m
        sizes += np.bincount(ec_key, weights=graph.adapter_sizes[ec_class]
                             - _lookup(ext.hist_codes, ext.hist_counts, base0[ec_key] * m + ec_class),
                             minlength=n_keys).astype(np.int64)
        # loose entries of the other extensions, minus those in whole classes of the union
        sizes += np.bincount(other_key, weights=ext.n_loose[other_ext], minlength=n_keys).astype(np.int64)
        hist_ptr = np.zeros(n_ext + 1, dtype=np.int64)
        np.cumsum(np.bincount(ext.hist_codes // m, minlength=n_ext), out=hist_ptr[1:])
        h_owner, h_pos = _gather_positions(hist_ptr, other_ext)
        h_key, h_class = other_key[h_owner], ext.hist_codes[h_pos] % m
        whole = self.has_class(h_key, h_class)
        sizes -= np.bincount(h_key[whole], weights=ext.hist_counts[h_pos][whole], minlength=n_keys).astype(np.int64)
        # entries loose in several extensions of a key: count them once
        dup_key, dup_node, dup_mult = self._shared(ext, n_ext, n_keys)
        classed = adapter[dup_node] >= 0
        in_w = np.zeros(dup_node.size, dtype=bool)
        in_w[classed] = self.has_class(dup_key[classed], adapter[dup_node[classed]])
        keep = ~in_w
        sizes -= np.bincount(dup_key[keep], weights=dup_mult[keep] - 1, minlength=n_keys).astype(np.int64)
        keep &= classed
        self.dup_codes, self.dup_counts = _unique_counts(np.repeat(dup_key[keep] * m + adapter[dup_node[keep]],
                                                                   dup_mult[keep] - 1))
        self.sizes = sizes

    def _shared(self, ext: _Extensions, n_ext: int, n_keys: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(key, entry, multiplicity) for entries loose in two or more extensions of the same key."""
        empty = np.zeros(0, dtype=np.int64)
        multi_keys = np.flatnonzero(self.length >= 2)
        if multi_keys.size == 0:
            return empty, empty, empty
        # item pairs (i < j) of every multi-extension key
        k_owner, k_item = _gather(self.item_ptr, self.item_ext, multi_keys)
        p_owner, p_item = _gather(self.item_ptr, self.item_ext, multi_keys[k_owner])
        first, second = k_item[p_owner], p_item
        keep = first < second
        pair_key = multi_keys[k_owner[p_owner[keep]]]
        pair_codes = first[keep] * n_ext + second[keep]
        pair_order = np.argsort(pair_codes, kind="stable")
        pair_codes, pair_key = pair_codes[pair_order], pair_key[pair_order]
        # inverted index over the loose entries of the extensions those keys use
        relevant = np.zeros(n_ext, dtype=bool)
        relevant[self.item_ext[np.repeat(self.length >= 2, self.length)]] = True
        owners = np.repeat(np.arange(n_ext, dtype=np.int64), ext.n_loose)
        pick = relevant[owners]
        nodes, owners = ext.lse_nodes[pick], owners[pick]
        order = np.argsort(nodes, kind="stable")
        nodes, owners = nodes[order], owners[order]
        if nodes.size < 2:
            return empty, empty, empty
        new = np.ones(nodes.size, dtype=bool)
        new[1:] = nodes[1:] != nodes[:-1]
        group = np.cumsum(new) - 1
        group_ptr = np.zeros(int(group[-1]) + 2, dtype=np.int64)
        np.cumsum(np.bincount(group), out=group_ptr[1:])
        entry = np.flatnonzero(np.diff(group_ptr)[group] >= 2)
        e_owner, partner = _gather(group_ptr, owners, group[entry])
        a, b = owners[entry][e_owner], partner
        keep = a < b
        triple_codes = a[keep] * n_ext + b[keep]
        triple_nodes = nodes[entry][e_owner][keep]
        # join (extension pair, entry) with the keys holding that pair
        lo = np.searchsorted(pair_codes, triple_codes, side="left")
        hi = np.searchsorted(pair_codes, triple_codes, side="right")
        span = hi - lo
        t_owner = np.repeat(np.arange(triple_codes.size, dtype=np.int64), span)
        position = np.arange(int(span.sum()), dtype=np.int64) + (lo - (np.cumsum(span) - span))[t_owner]
        key_node = _unique(pair_key[position] * self.n + triple_nodes[t_owner])
        dup_key, dup_node = key_node // self.n, key_node % self.n
        mult = self._count_items(dup_key, dup_node, ext.lse_codes, self.n)
        return dup_key, dup_node, mult

    def _count_items(self, key: np.ndarray, values: np.ndarray, codes: np.ndarray, scale: int) -> np.ndarray:
        owner, item = _gather(self.item_ptr, self.item_ext, key)
        hit = _in_sorted(codes, item * scale + values[owner])
        return np.bincount(owner[hit], minlength=key.size).astype(np.int64)

    def _any_item(self, key: np.ndarray, values: np.ndarray, codes: np.ndarray, scale: int) -> np.ndarray:
        length = self.length[key]
        found = np.zeros(key.size, dtype=bool)
        one = np.flatnonzero(length == 1)
        item = self.item_ext[self.item_ptr[key[one]]]
        found[one] = _in_sorted(codes, item * scale + values[one])
        multi = np.flatnonzero(length >= 2)
        owner, item = _gather(self.item_ptr, self.item_ext, key[multi])
        hit = _in_sorted(codes, item * scale + values[multi][owner])
        found[multi[owner[hit]]] = True
        return found

    def has_class(self, key: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """Is adapter class K whole in the key's union?"""
        return self._any_item(key, classes, self.ext.ccls_codes, self.m)

    def has_loose(self, key: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """Is the entry a loose entry of one of the key's extensions?"""
        return self._any_item(key, nodes, self.ext.lse_codes, self.n)

    def loose_of_class(self, key: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """How many loose entries of class K (not whole in the union) the key's union holds."""
        ext, m = self.ext, self.m
        owner, item = _gather(self.item_ptr, self.item_ext, key)
        counts = _lookup(ext.hist_codes, ext.hist_counts, item * m + classes[owner])
        total = np.bincount(owner, weights=counts, minlength=key.size).astype(np.int64)
        return total - _lookup(self.dup_codes, self.dup_counts, key * m + classes)


def closure_sizes(graph: ProvenanceGraph, targets: np.ndarray | list[int], radius: int = 3) -> np.ndarray:
    """|C({e})| (adapter-aware closure, depth ``radius``) for each target, exactly, without a BFS per entry.

    Why it is exact: take a path of length <= r from e. If it never jumps within an adapter class it
    stays in the tree ball B_T(e, r). Otherwise its first jump leaves from an entry u of class K at tree
    distance d <= r-1, lands anywhere in K at distance d+1, and the rest of the path stays within
    Ext(K, r-1-d), the entries within r-1-d steps of K. So the ball is B_T(e, r) united with Ext(K, s)
    over the classes K met in B_T(e, r-1). Ext(K, s) is computed once per (K, s) as whole classes (sizes
    known; classes are disjoint) plus loose entries. Most entries of an episode meet only their own
    class nearby and are exactly |Ext(K, r-1)| (see ``_single_class_radius3``); entries with no class
    nearby are a tree ball; the rest share the union of their large extensions by key and add their
    small ones one by one. Radii above 3 fall back to one BFS per target (slow on large graphs).
    """
    targets = np.asarray(targets, dtype=np.int64)
    if radius < 0:
        raise ValueError("radius must be >= 0")
    if targets.size == 0:
        return np.zeros(0, dtype=np.int64)
    if targets.min() < 0 or targets.max() >= graph.n:
        raise ValueError("target indices must be in [0, n)")
    if radius == 0:
        return np.ones(targets.size, dtype=np.int64)
    if radius > 3:
        return reference_closure_sizes(graph, targets, radius)
    if targets.size < 2 or bool(np.all(targets[1:] > targets[:-1])):  # already sorted and distinct (a closure)
        return _closure_sizes_unique(graph, targets, radius)
    unique_targets, inverse = _unique_inverse(targets)
    sizes = _closure_sizes_unique(graph, unique_targets, radius)
    return sizes[inverse]


def _closure_sizes_unique(graph: ProvenanceGraph, targets: np.ndarray, radius: int) -> np.ndarray:
    n, m = graph.n, graph.n_adapters
    adapter = graph.adapter
    sizes = np.zeros(targets.size, dtype=np.int64)
    budget_max = radius - 1

    empty = ~_within_mask(graph, adapter >= 0, budget_max)[targets]
    if empty.any():
        few = targets[empty]
        if few.size * 64 < n:  # a handful: enumerate their balls instead of counting over the whole forest
            sizes[empty] = np.bincount(_tree_ball_pairs(graph, few, radius)[0], minlength=few.size)
        else:
            sizes[empty] = _tree_ball_sizes(graph, few, radius)
    if radius == 3:
        pure = _single_class_radius3(graph)[targets]
    elif radius == 2:
        pure = _pure_mask(graph, budget_max)[targets]
    else:
        pure = np.zeros(targets.size, dtype=bool)
    mixed = ~empty & ~pure
    mixed_targets = targets[mixed]
    n_mixed = mixed_targets.size

    # tree balls of mixed targets, and the (class, budget) items met in them (max budget per class);
    # a classed target's own class is always an item with the full budget
    owner, node, dist = _tree_ball_pairs(graph, mixed_targets, radius)
    own_class = adapter[mixed_targets]
    node_class = adapter[node]
    foreign = (dist <= budget_max) & (node_class >= 0) & (node_class != own_class[owner])
    item_codes = owner[foreign] * m + node_class[foreign]
    item_budget = budget_max - dist[foreign].astype(np.int64)
    order = np.lexsort((-item_budget, item_codes))
    item_codes, item_budget = item_codes[order], item_budget[order]
    first = np.ones(item_codes.size, dtype=bool)
    first[1:] = item_codes[1:] != item_codes[:-1]
    own = np.flatnonzero(own_class >= 0)
    item_owner = np.concatenate([item_codes[first] // m, own])
    item_class = np.concatenate([item_codes[first] % m, own_class[own]])
    item_budget = np.concatenate([item_budget[first], np.full(own.size, budget_max, dtype=np.int64)])
    # tree-ball entries of the target's own class are inside its union already
    rest = ~((node_class >= 0) & (node_class == own_class[owner]))
    owner, node = owner[rest], node[rest]

    pure_classes = adapter[targets[pure]]
    present = np.flatnonzero(np.bincount(pure_classes, minlength=m))  # few distinct classes, many targets
    ext_codes = _unique(np.concatenate([item_class * 3 + item_budget, present * 3 + budget_max]))
    ext = _extensions(graph, ext_codes)
    sizes[pure] = ext.sizes[np.searchsorted(ext_codes, pure_classes * 3 + budget_max)]
    if not n_mixed:
        return sizes
    item_ext = np.searchsorted(ext_codes, item_class * 3 + item_budget)
    order = np.lexsort((item_ext, item_owner))
    item_owner, item_ext = item_owner[order], item_ext[order]
    heavy = (ext.n_whole + ext.n_loose)[item_ext] > LIGHT_LIMIT

    # ---- heavy extensions: one union per distinct set ("key") of heavy extensions ----
    h_owner, h_ext = item_owner[heavy], item_ext[heavy]
    counts = np.bincount(h_owner, minlength=n_mixed)
    starts = np.zeros(n_mixed, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    table = np.full((n_mixed, max(int(counts.max()), 1)), -1, dtype=np.int64)
    table[h_owner, np.arange(h_owner.size, dtype=np.int64) - starts[h_owner]] = h_ext
    keys, key_of = _unique_rows(table)
    heavy_union = _HeavyUnion(graph, ext, keys)
    key_size = heavy_union.sizes
    in_heavy_classes = heavy_union.has_class
    heavy_loose_of_class = heavy_union.loose_of_class
    in_heavy_loose = heavy_union.has_loose

    # ---- light extensions and the tree ball, target by target ----
    l_owner, l_ext = item_owner[~heavy], item_ext[~heavy]
    lc_owner, lc_class = _gather(ext.ccls_ptr, ext.ccls_classes, l_ext)
    lc_owner = l_owner[lc_owner]
    fresh = ~in_heavy_classes(key_of[lc_owner], lc_class)
    light_c = _unique(lc_owner[fresh] * m + lc_class[fresh])
    lc_owner, lc_class = light_c // m, light_c % m
    class_add = graph.adapter_sizes[lc_class] - heavy_loose_of_class(key_of[lc_owner], lc_class)
    sizes_mixed = key_size[key_of] + np.bincount(lc_owner, weights=class_add, minlength=n_mixed).astype(np.int64)

    ll_owner, ll_node = _gather(ext.lse_ptr, ext.lse_nodes, l_ext)
    cand = _unique(np.concatenate([l_owner[ll_owner] * n + ll_node, owner * n + node]))
    c_owner, c_node = cand // n, cand % n
    c_key = key_of[c_owner]
    covered = in_heavy_loose(c_key, c_node)
    classed = adapter[c_node] >= 0
    c_class = adapter[c_node[classed]]
    covered[classed] |= in_heavy_classes(c_key[classed], c_class) | _in_sorted(light_c, c_owner[classed] * m + c_class)
    sizes_mixed += np.bincount(c_owner[~covered], minlength=n_mixed)
    sizes[mixed] = sizes_mixed
    return sizes


def reference_closure_sizes(graph: ProvenanceGraph, targets: np.ndarray | list[int], radius: int = 3) -> np.ndarray:
    """One BFS per target (the seed's way): the oracle :func:`closure_sizes` is tested against."""
    return np.array([len(reference_closure(graph, [int(t)], radius)[0]) for t in np.asarray(targets).tolist()],
                    dtype=np.int64)
