"""|C({e})| for every entry of a closure at once: the propagation term of the FROC risk, exactly.

The FROC risk needs |C({e})| (depth 3) for *every* entry of the closure. Doing one BFS per entry is
quadratic when adapters are large (each BFS holds the whole adapter). :func:`closure_sizes` computes
the same numbers exactly without per-entry BFS, by decomposing each ball into whole adapter classes
plus a "loose" fringe (see its docstring); tests compare it with the per-entry BFS on random graphs.

One module because it is one algorithm: the tree-ball counts, the adapter-class extensions and the
heavy-key unions below are the three terms of the same exact decomposition and are used nowhere else.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from rvu_pipelines.machine import usable_cores
from rvu_pipelines.provenance.closure import ProvenanceGraph, reference_closure_sizes
from rvu_pipelines.provenance.intsets import (
    gather_positions,
    gather_rows,
    in_sorted,
    lookup_codes,
    sorted_unique,
    sorted_unique_counts,
    sorted_unique_inverse,
    unique_rows,
)


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
    child, par = graph.edges
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
    child, par = graph.edges
    children_indptr, children = graph.children_csr
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


def _tree_ball_pairs(
    graph: ProvenanceGraph, targets: np.ndarray, radius: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(target position, node, distance) for every node within ``radius`` tree steps of each target."""
    children_indptr, children = graph.children_csr
    owner = np.arange(targets.size, dtype=np.int64)
    node = targets.astype(np.int64)
    prev = np.full(targets.size, -1, dtype=np.int64)
    owners, nodes, dists = [owner], [node], [np.zeros(targets.size, dtype=np.int8)]
    for distance in range(1, radius + 1):
        up = graph.parent[node]
        keep = (up >= 0) & (up != prev)
        child_owner, child = gather_rows(children_indptr, children, node)
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


def _extensions(graph: ProvenanceGraph, ext_codes: np.ndarray) -> _Extensions:
    """Whole classes and loose entries of Ext(K, s), s in {0, 1, 2}, for each sorted code K * 3 + s.

    Ext(K,0) = K. Ext(K,1) = K + F1(K), F1 = tree neighbours of K outside K. Ext(K,2) = K + F1 + F2 +
    every class met in F1, with F2 = tree neighbours of F1 outside K and F1.
    """
    n, m = graph.n, graph.n_adapters
    parent, adapter = graph.parent, graph.adapter
    children_indptr, children = graph.children_csr
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
    f1_codes = sorted_unique(np.concatenate(f1_parts_owner) * n + np.concatenate(f1_parts_node))
    f1_owner, f1_node = f1_codes // n, f1_codes % n

    # F2: tree neighbours of F1 entries (budget-2 extensions), outside K and F1
    two = ext_budget[f1_owner] == 2
    g_owner, g_node = f1_owner[two], f1_node[two]
    up = parent[g_node]
    has_up = up >= 0
    c_owner, c_node = gather_rows(children_indptr, children, g_node)
    n_owner = np.concatenate([g_owner[has_up], g_owner[c_owner]])
    n_node = np.concatenate([up[has_up], c_node])
    keep = adapter[n_node] != ext_class[n_owner]
    f2_codes = sorted_unique(n_owner[keep] * n + n_node[keep])
    f2_codes = f2_codes[~in_sorted(f1_codes, f2_codes)]

    # whole classes: K itself, plus (budget 2) every class met in F1
    f1_classed = two & (adapter[f1_node] >= 0)
    ccls_codes = sorted_unique(
        np.concatenate(
            [np.arange(n_ext, dtype=np.int64) * m + ext_class, f1_owner[f1_classed] * m + adapter[f1_node[f1_classed]]]
        )
    )
    # loose entries: F1 and F2 minus entries of whole classes
    lse_codes = np.concatenate([f1_codes, f2_codes])
    lse_owner, lse_node = lse_codes // n, lse_codes % n
    classed = adapter[lse_node] >= 0
    in_whole = np.zeros(lse_codes.size, dtype=bool)
    in_whole[classed] = in_sorted(ccls_codes, lse_owner[classed] * m + adapter[lse_node[classed]])
    lse_codes = np.sort(lse_codes[~in_whole])
    lse_owner, lse_node = lse_codes // n, lse_codes % n

    lse_ptr = np.zeros(n_ext + 1, dtype=np.int64)
    np.cumsum(np.bincount(lse_owner, minlength=n_ext), out=lse_ptr[1:])
    ccls_owner, ccls_classes = ccls_codes // m, ccls_codes % m
    ccls_ptr = np.zeros(n_ext + 1, dtype=np.int64)
    np.cumsum(np.bincount(ccls_owner, minlength=n_ext), out=ccls_ptr[1:])
    classed = adapter[lse_node] >= 0
    hist_codes, hist_counts = sorted_unique_counts(lse_owner[classed] * m + adapter[lse_node[classed]])
    whole = np.bincount(ccls_owner, weights=graph.adapter_sizes[ccls_classes], minlength=n_ext).astype(np.int64)
    return _Extensions(
        ccls_codes,
        ccls_ptr,
        ccls_classes,
        lse_codes,
        lse_ptr,
        lse_node,
        hist_codes,
        hist_counts,
        whole,
        whole + np.diff(lse_ptr),
    )


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
        oc_owner, oc_class = gather_rows(ext.ccls_ptr, ext.ccls_classes, other_ext)
        oc_key = other_key[oc_owner]
        fresh = ~in_sorted(ext.ccls_codes, base0[oc_key] * m + oc_class)
        extra_c = sorted_unique(oc_key[fresh] * m + oc_class[fresh])
        ec_key, ec_class = extra_c // m, extra_c % m
        sizes += np.bincount(
            ec_key,
            weights=graph.adapter_sizes[ec_class]
            - lookup_codes(ext.hist_codes, ext.hist_counts, base0[ec_key] * m + ec_class),
            minlength=n_keys,
        ).astype(np.int64)
        # loose entries of the other extensions, minus those in whole classes of the union
        sizes += np.bincount(other_key, weights=ext.n_loose[other_ext], minlength=n_keys).astype(np.int64)
        hist_ptr = np.zeros(n_ext + 1, dtype=np.int64)
        np.cumsum(np.bincount(ext.hist_codes // m, minlength=n_ext), out=hist_ptr[1:])
        h_owner, h_pos = gather_positions(hist_ptr, other_ext)
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
        self.dup_codes, self.dup_counts = sorted_unique_counts(
            np.repeat(dup_key[keep] * m + adapter[dup_node[keep]], dup_mult[keep] - 1)
        )
        self.sizes = sizes

    def _shared(self, ext: _Extensions, n_ext: int, n_keys: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(key, entry, multiplicity) for entries loose in two or more extensions of the same key."""
        empty = np.zeros(0, dtype=np.int64)
        multi_keys = np.flatnonzero(self.length >= 2)
        if multi_keys.size == 0:
            return empty, empty, empty
        # item pairs (i < j) of every multi-extension key
        k_owner, k_item = gather_rows(self.item_ptr, self.item_ext, multi_keys)
        p_owner, p_item = gather_rows(self.item_ptr, self.item_ext, multi_keys[k_owner])
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
        e_owner, partner = gather_rows(group_ptr, owners, group[entry])
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
        key_node = sorted_unique(pair_key[position] * self.n + triple_nodes[t_owner])
        dup_key, dup_node = key_node // self.n, key_node % self.n
        mult = self._count_items(dup_key, dup_node, ext.lse_codes, self.n)
        return dup_key, dup_node, mult

    def _count_items(self, key: np.ndarray, values: np.ndarray, codes: np.ndarray, scale: int) -> np.ndarray:
        owner, item = gather_rows(self.item_ptr, self.item_ext, key)
        hit = in_sorted(codes, item * scale + values[owner])
        return np.bincount(owner[hit], minlength=key.size).astype(np.int64)

    def _any_item(self, key: np.ndarray, values: np.ndarray, codes: np.ndarray, scale: int) -> np.ndarray:
        length = self.length[key]
        found = np.zeros(key.size, dtype=bool)
        one = np.flatnonzero(length == 1)
        item = self.item_ext[self.item_ptr[key[one]]]
        found[one] = in_sorted(codes, item * scale + values[one])
        multi = np.flatnonzero(length >= 2)
        owner, item = gather_rows(self.item_ptr, self.item_ext, key[multi])
        hit = in_sorted(codes, item * scale + values[multi][owner])
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
        owner, item = gather_rows(self.item_ptr, self.item_ext, key)
        counts = lookup_codes(ext.hist_codes, ext.hist_counts, item * m + classes[owner])
        total = np.bincount(owner, weights=counts, minlength=key.size).astype(np.int64)
        return total - lookup_codes(self.dup_codes, self.dup_counts, key * m + classes)


def closure_sizes(
    graph: ProvenanceGraph, targets: np.ndarray | list[int], radius: int = 3, *, workers: int | None = None
) -> np.ndarray:
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

    ``workers`` threads (default: the usable cores, at most 4; 1 below 100,000 targets) share the
    whole-graph masks and split the targets into contiguous chunks: numpy releases the GIL in the array
    work, so two threads take ~0.6x the time of one. The result is the same for any ``workers``.
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
        return _closure_sizes_parallel(graph, targets, radius, workers)
    unique_targets, inverse = sorted_unique_inverse(targets)
    sizes = _closure_sizes_parallel(graph, unique_targets, radius, workers)
    return sizes[inverse]


PARALLEL_MIN_TARGETS = 100_000
MAX_WORKERS = 4


def _closure_sizes_parallel(
    graph: ProvenanceGraph, targets: np.ndarray, radius: int, workers: int | None
) -> np.ndarray:
    """Whole-graph masks once, then the sorted distinct ``targets`` in contiguous chunks, one per thread."""
    if workers is None:
        workers = min(MAX_WORKERS, usable_cores()) if targets.size >= PARALLEL_MIN_TARGETS else 1
    workers = max(1, min(int(workers), targets.size))
    adapter = graph.adapter
    budget_max = radius - 1

    def far_from_classes() -> np.ndarray:
        return ~_within_mask(graph, adapter >= 0, budget_max)

    def pure_mask() -> np.ndarray:
        if radius == 3:
            return _single_class_radius3(graph)
        if radius == 2:
            return _pure_mask(graph, budget_max)
        return np.zeros(graph.n, dtype=bool)

    if workers == 1:
        return _closure_sizes_unique(graph, targets, radius, far_from_classes(), pure_mask())
    cached = (graph.edges, graph.children_csr, graph.adapter_sizes)  # built once here, before threads read them
    del cached
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rvu-closure-sizes") as pool:
        empty_future, pure_future = pool.submit(far_from_classes), pool.submit(pure_mask)
        empty_all, pure_all = empty_future.result(), pure_future.result()
        chunks = np.array_split(targets, workers)
        parts = pool.map(lambda chunk: _closure_sizes_unique(graph, chunk, radius, empty_all, pure_all), chunks)
        return np.concatenate(list(parts))


def _closure_sizes_unique(
    graph: ProvenanceGraph, targets: np.ndarray, radius: int, far_from_classes: np.ndarray, pure_all: np.ndarray
) -> np.ndarray:
    """|C({e})| for sorted distinct ``targets``; the two whole-graph masks come from the caller."""
    n, m = graph.n, graph.n_adapters
    adapter = graph.adapter
    sizes = np.zeros(targets.size, dtype=np.int64)
    budget_max = radius - 1

    empty = far_from_classes[targets]
    if empty.any():
        few = targets[empty]
        if few.size * 64 < n:  # a handful: enumerate their balls instead of counting over the whole forest
            sizes[empty] = np.bincount(_tree_ball_pairs(graph, few, radius)[0], minlength=few.size)
        else:
            sizes[empty] = _tree_ball_sizes(graph, few, radius)
    pure = pure_all[targets]
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
    ext_codes = sorted_unique(np.concatenate([item_class * 3 + item_budget, present * 3 + budget_max]))
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
    keys, key_of = unique_rows(table)
    heavy_union = _HeavyUnion(graph, ext, keys)
    key_size = heavy_union.sizes
    in_heavy_classes = heavy_union.has_class
    heavy_loose_of_class = heavy_union.loose_of_class
    in_heavy_loose = heavy_union.has_loose

    # ---- light extensions and the tree ball, target by target ----
    l_owner, l_ext = item_owner[~heavy], item_ext[~heavy]
    lc_owner, lc_class = gather_rows(ext.ccls_ptr, ext.ccls_classes, l_ext)
    lc_owner = l_owner[lc_owner]
    fresh = ~in_heavy_classes(key_of[lc_owner], lc_class)
    light_c = sorted_unique(lc_owner[fresh] * m + lc_class[fresh])
    lc_owner, lc_class = light_c // m, light_c % m
    class_add = graph.adapter_sizes[lc_class] - heavy_loose_of_class(key_of[lc_owner], lc_class)
    sizes_mixed = key_size[key_of] + np.bincount(lc_owner, weights=class_add, minlength=n_mixed).astype(np.int64)

    ll_owner, ll_node = gather_rows(ext.lse_ptr, ext.lse_nodes, l_ext)
    cand = sorted_unique(np.concatenate([l_owner[ll_owner] * n + ll_node, owner * n + node]))
    c_owner, c_node = cand // n, cand % n
    c_key = key_of[c_owner]
    covered = in_heavy_loose(c_key, c_node)
    classed = adapter[c_node] >= 0
    c_class = adapter[c_node[classed]]
    covered[classed] |= in_heavy_classes(c_key[classed], c_class) | in_sorted(light_c, c_owner[classed] * m + c_class)
    sizes_mixed += np.bincount(c_owner[~covered], minlength=n_mixed)
    sizes[mixed] = sizes_mixed
    return sizes
