"""Sorted int64 sets and CSR grouping on numpy arrays, shared by the closure, the store and recovery.

Entry and adapter sets travel through recovery as sorted int64 arrays of seqs; these helpers keep every
set operation on that path a sort or a binary search (see ``sorted_unique`` for why not ``np.unique``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def csr_by_key(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of node indices grouped by ``keys`` (entries with key < 0 are left out)."""
    nodes = np.flatnonzero(keys >= 0)
    order = np.argsort(keys[nodes], kind="stable")
    values = nodes[order].astype(np.int64)
    counts = np.bincount(keys[nodes], minlength=size)
    indptr = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, values


def gather_positions(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row in ``rows``: the positions of its CSR values. Returns (position in ``rows``, index)."""
    starts = indptr[rows]
    lengths = indptr[rows + 1] - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(rows.size, dtype=np.int64), lengths)
    ends = np.cumsum(lengths)
    return owner, np.arange(total, dtype=np.int64) + (starts - (ends - lengths))[owner]


def gather_rows(indptr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row in ``rows``: its CSR values. Returns (position in ``rows``, value) pairs."""
    owner, positions = gather_positions(indptr, rows)
    return owner, values[positions]


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values. numpy 2.4's ``np.unique`` (and ``union1d``) take a hash path that is
    50-100x slower than a sort on these arrays (0.6-0.9 s for 10^6 ints); every set operation in the
    recovery path goes through this instead. Input that is already strictly increasing (a closure, a
    risk table's seqs) is copied, not sorted: the check is one pass, the sort of 10^6 sorted ints 30 ms."""
    if values.size >= 2 and bool(np.all(values[1:] > values[:-1])):
        return values.copy()
    ordered = np.sort(values)
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def sorted_unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def sorted_unique_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    distinct, inverse = sorted_unique_inverse(values)
    return distinct, np.bincount(inverse, minlength=distinct.size).astype(np.int64)


def unique_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def unique_ints(values: np.ndarray | Sequence[int]) -> np.ndarray:
    """Sorted distinct int64 values (fast; see ``sorted_unique``)."""
    return sorted_unique(np.asarray(values, dtype=np.int64).ravel())


def union_ints(*arrays: np.ndarray) -> np.ndarray:
    """Sorted union of int arrays."""
    return unique_ints(np.concatenate([np.asarray(a, dtype=np.int64).ravel() for a in arrays]))


def in_sorted(sorted_codes: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Boolean mask: which ``queries`` occur in the sorted array ``sorted_codes``."""
    if sorted_codes.size == 0 or queries.size == 0:
        return np.zeros(queries.shape, dtype=bool)
    positions = np.searchsorted(sorted_codes, queries)
    positions[positions == sorted_codes.size] = 0
    return sorted_codes[positions] == queries


def lookup_codes(sorted_codes: np.ndarray, values: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """values[i] where sorted_codes[i] == code, else 0."""
    if sorted_codes.size == 0 or codes.size == 0:
        return np.zeros(codes.size, dtype=np.int64)
    positions = np.searchsorted(sorted_codes, codes)
    positions[positions == sorted_codes.size] = 0
    return np.where(sorted_codes[positions] == codes, values[positions], 0)
