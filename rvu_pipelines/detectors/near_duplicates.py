"""Near-duplicate texts: MinHash over word 5-grams, LSH banding, exact Jaccard on candidates, union-find.

A text's shingles are its word 5-grams after lowercasing and whitespace normalisation (a text of fewer
than five words is one shingle: all its words). Two texts are near-duplicates when the exact Jaccard
similarity of their shingle sets is at least 0.5; clusters are the connected
components of that relation (union-find), so a chain of near-twins forms one cluster.

Candidates come from MinHash signatures (128 multiply-shift hash functions over 64-bit blake2b shingle
hashes, seeded) cut into 64 bands of 2 rows: two texts become a candidate pair when any band agrees.
A pair with Jaccard J is missed with probability (1 - J^2)^64, which is 1e-8 at J = 0.5, so the
candidate set is in effect complete at the threshold; every candidate is then checked exactly, so no
pair below the threshold is reported. Everything is deterministic (content hashes, a fixed seed, sorted
output). :func:`exact_pairs` is the brute-force reference (all pairs through a sparse intersection
matrix), used by the tests to check the LSH path and to check splits independently of it.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NGRAM = 5
THRESHOLD = 0.5
NUM_PERM = 128
BANDS = 64  # 2 rows per band
MINHASH_SEED = 42
_MASK32 = np.uint64(0xFFFFFFFF)


def shingles(text: str, n: int = NGRAM) -> set[str]:
    """Word n-grams of the lowercased, whitespace-normalised text; one shingle if it has fewer than n words."""
    words = str(text).lower().split()
    if not words:
        return set()
    if len(words) < n:
        return {" ".join(words)}
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


@functools.lru_cache(maxsize=65_536)
def shingle_hashes(text: str, n: int = NGRAM) -> np.ndarray:
    """Sorted unique 64-bit content hashes (blake2b) of the text's shingles: stable across processes.

    Read-only and kept per text (bounded): the corpora, their splits and the leak checks hash the same texts again,
    and hashing shingle by shingle is most of a near-duplicate pass."""
    values = {int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little") for s in shingles(text, n)}
    out = np.array(sorted(values), dtype=np.uint64)
    out.flags.writeable = False
    return out


def minhash_signatures(
    hash_sets: Sequence[np.ndarray], num_perm: int = NUM_PERM, seed: int = MINHASH_SEED
) -> np.ndarray:
    """One row of ``num_perm`` 32-bit minima per text (multiply-shift hashing of the 64-bit shingle hashes).

    An empty text gets all-ones (2^32 - 1): it matches only other empty texts, whose Jaccard is then
    checked exactly (and is 0, see :func:`jaccard`).
    """
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) | np.uint64(1)  # odd multipliers
    b = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
    out = np.full((len(hash_sets), num_perm), 0xFFFFFFFF, dtype=np.uint64)
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2^64 by design
        for row, values in enumerate(hash_sets):
            if values.size:
                hashed = (values[:, None] * a[None, :] + b[None, :]) >> np.uint64(32)
                out[row] = hashed.min(axis=0)
    return (out & _MASK32).astype(np.uint32)


def lsh_candidates(signatures: np.ndarray, bands: int = BANDS) -> np.ndarray:
    """Pairs (i < j) whose signatures agree on all rows of at least one band; shape (m, 2), sorted."""
    n, num_perm = signatures.shape
    if num_perm % bands:
        raise ValueError(f"{num_perm} hash functions do not cut into {bands} equal bands.")
    rows = num_perm // bands
    found: list[np.ndarray] = []
    for band in range(bands):
        block = np.ascontiguousarray(signatures[:, band * rows : (band + 1) * rows])
        keys = block.view(np.dtype((np.void, block.dtype.itemsize * rows))).ravel()
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
        ends = np.r_[starts[1:], n]
        for start, end in zip(starts, ends, strict=True):
            if end - start > 1:
                members = np.sort(order[start:end])
                i, j = np.triu_indices(members.size, k=1)
                found.append(np.stack([members[i], members[j]], axis=1))
    if not found:
        return np.empty((0, 2), dtype=np.int64)
    return np.unique(np.concatenate(found).astype(np.int64), axis=0)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted unique hash arrays (0 when both are empty)."""
    if a.size == 0 or b.size == 0:
        return 0.0
    inter = np.intersect1d(a, b, assume_unique=True).size
    return inter / (a.size + b.size - inter)


def cluster_labels(n: int, pairs: np.ndarray) -> np.ndarray:
    """Union-find components: each item's label is the smallest index in its component."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in pairs.tolist():
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    return np.array([find(x) for x in range(n)], dtype=np.int64)


@dataclass(frozen=True)
class NearDuplicates:
    """Near-duplicate pairs (i < j, exact Jaccard >= threshold) and cluster labels over ``n`` texts."""

    n: int
    pairs: np.ndarray  # (m, 2) int64, sorted
    similarity: np.ndarray  # (m,) exact Jaccard of each pair
    labels: np.ndarray  # (n,) smallest index of each text's cluster
    n_candidates: int = 0

    @property
    def n_clusters(self) -> int:
        return int(np.unique(self.labels).size)

    def in_clusters(self) -> int:
        """How many texts have at least one near-duplicate (sit in a cluster of two or more)."""
        sizes = np.bincount(self.labels, minlength=self.n)
        return int((sizes[self.labels] > 1).sum())

    def summary(self) -> dict[str, int]:
        sizes = np.bincount(self.labels, minlength=self.n)
        multi = sizes[sizes > 1]
        return {
            "texts": self.n,
            "near_duplicate_pairs": int(self.pairs.shape[0]),
            "texts_with_a_near_duplicate": self.in_clusters(),
            "clusters": self.n_clusters,
            "multi_text_clusters": int(multi.size),
            "largest_cluster": int(sizes.max()) if self.n else 0,
        }


def near_duplicates(
    texts: Sequence[str],
    *,
    threshold: float = THRESHOLD,
    n: int = NGRAM,
    num_perm: int = NUM_PERM,
    bands: int = BANDS,
    seed: int = MINHASH_SEED,
) -> NearDuplicates:
    """Near-duplicate pairs and clusters of ``texts`` (MinHash + LSH candidates, exact Jaccard check)."""
    hashes = [shingle_hashes(t, n) for t in texts]
    candidates = lsh_candidates(minhash_signatures(hashes, num_perm, seed), bands)
    sims = np.array([jaccard(hashes[i], hashes[j]) for i, j in candidates.tolist()], dtype=np.float64)
    keep = sims >= threshold
    pairs, sims = candidates[keep], sims[keep]
    return NearDuplicates(len(hashes), pairs, sims, cluster_labels(len(hashes), pairs), int(candidates.shape[0]))


def exact_pairs(texts: Sequence[str], *, threshold: float = THRESHOLD, n: int = NGRAM) -> np.ndarray:
    """Every pair (i < j) with Jaccard >= threshold, by brute force (a sparse all-pairs intersection)."""
    from scipy import sparse

    hashes = [shingle_hashes(t, n) for t in texts]
    vocabulary = {h: k for k, h in enumerate(np.unique(np.concatenate([*hashes, np.empty(0, np.uint64)])).tolist())}
    rows = np.repeat(np.arange(len(hashes)), [h.size for h in hashes])
    cols = np.array([vocabulary[h] for values in hashes for h in values.tolist()], dtype=np.int64)
    matrix = sparse.csr_matrix((np.ones(cols.size, dtype=np.int32), (rows, cols)), shape=(len(hashes), len(vocabulary)))
    inter = sparse.triu(matrix @ matrix.T, k=1).tocoo()
    sizes = np.array([h.size for h in hashes], dtype=np.float64)
    union = sizes[inter.row] + sizes[inter.col] - inter.data
    keep = inter.data / union >= threshold
    pairs = np.stack([inter.row[keep], inter.col[keep]], axis=1).astype(np.int64)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))] if pairs.size else np.empty((0, 2), dtype=np.int64)


def cross_pairs(
    left: Sequence[str], right: Sequence[str], *, threshold: float = THRESHOLD, exact: bool = False
) -> np.ndarray:
    """Near-duplicate pairs (index in ``left``, index in ``right``) between two collections."""
    texts = [*left, *right]
    pairs = exact_pairs(texts, threshold=threshold) if exact else near_duplicates(texts, threshold=threshold).pairs
    across = (pairs[:, 0] < len(left)) & (pairs[:, 1] >= len(left))
    out = pairs[across].copy()
    out[:, 1] -= len(left)
    return out
