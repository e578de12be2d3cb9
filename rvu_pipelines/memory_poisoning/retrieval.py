"""A retrieval memory: embedded entries in a FAISS inner-product index, top-k by cosine similarity.

Embeddings are L2-normalised float32 (``SentenceEmbedder`` returns them so), so inner product is
cosine. ``IndexIDMap2`` over ``IndexFlatIP`` keeps exact search and lets entries be removed (a
quarantine) by id. Every matrix that enters is checked: shape, dimension, finiteness, unit norm.
"""

from __future__ import annotations

from collections.abc import Sequence

import faiss
import numpy as np

from rvu_pipelines.errors import MemoryPoisoningInputError
from rvu_pipelines.memory_poisoning.corpus import MemoryEntry
from rvu_pipelines.models.embedding import Embedder

DEFAULT_TOP_K = 5
NORM_TOLERANCE = 1e-3


def check_embeddings(vectors: object, n: int, dimension: int, what: str) -> np.ndarray:
    """``vectors`` as a C-contiguous float32 (n, dimension) matrix of unit rows, or a clear error."""
    array = np.asarray(vectors)
    if array.ndim != 2 or array.shape[0] != n:
        raise MemoryPoisoningInputError(f"{what}: expected {n} embeddings as an (n, d) matrix, got shape {array.shape}")
    if array.shape[1] != dimension:
        raise MemoryPoisoningInputError(
            f"{what}: embeddings have dimension {array.shape[1]} but the memory's embedder has {dimension}; "
            "embed with the same model as the memory"
        )
    if not np.issubdtype(array.dtype, np.floating):
        raise MemoryPoisoningInputError(f"{what}: embeddings must be floating point, got {array.dtype}")
    bad = ~np.isfinite(array).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise MemoryPoisoningInputError(
            f"{what}: {rows.size} embedding(s) contain NaN or inf (first rows {rows[:5].tolist()}); "
            "re-embed those texts, nothing was written"
        )
    array = np.ascontiguousarray(array, dtype=np.float32)
    if n:
        norms = np.linalg.norm(array, axis=1)
        off = np.abs(norms - 1.0) > NORM_TOLERANCE
        if off.any():
            raise MemoryPoisoningInputError(
                f"{what}: {int(off.sum())} embedding(s) are not unit length "
                f"(norms {norms[off][:3].round(4).tolist()}); "
                "normalise them (cosine retrieval assumes unit vectors)"
            )
    return array


def embed_texts(embedder: Embedder, texts: Sequence[str], what: str) -> np.ndarray:
    """Embed ``texts`` and check the result; an empty text is refused (it would embed to noise)."""
    empty = [i for i, t in enumerate(texts) if not str(t).strip()]
    if empty:
        raise MemoryPoisoningInputError(f"{what}: text(s) at {empty[:5]} are empty; nothing was embedded")
    if not texts:
        return np.zeros((0, embedder.dimension), dtype=np.float32)
    return check_embeddings(embedder.encode(list(texts)), len(texts), embedder.dimension, what)


class RetrievalMemory:
    """The agent's memory: entries, their embeddings, and exact top-k cosine retrieval.

    Entries are written with :meth:`add` (embedded here unless vectors are given) and removed with
    :meth:`remove`; ids are positions in the append-only ``entries`` list, so a removed entry's id
    is never reused and results stay reproducible.
    """

    def __init__(self, embedder: Embedder, *, top_k: int = DEFAULT_TOP_K) -> None:
        if top_k < 1:
            raise MemoryPoisoningInputError(f"top_k must be at least 1, got {top_k}")
        self.embedder = embedder
        self.top_k = top_k
        self.dimension = int(embedder.dimension)
        self.entries: list[MemoryEntry] = []
        self._vectors: list[np.ndarray] = []
        self._live: set[int] = set()
        self._keys: dict[str, int] = {}
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dimension))

    def __len__(self) -> int:
        return len(self._live)

    def add(self, entries: Sequence[MemoryEntry], vectors: np.ndarray | None = None) -> list[int]:
        """Write ``entries`` (all or nothing); returns their ids. A key already live is refused."""
        entries = list(entries)
        keys = [e.key for e in entries]
        clash = sorted({k for k in keys if k in self._keys and self._keys[k] in self._live} | _dupes(keys))
        if clash:
            raise MemoryPoisoningInputError(
                f"memory keys already present or repeated: {clash[:5]}; nothing was written"
            )
        if vectors is None:
            vectors = embed_texts(self.embedder, [e.text for e in entries], "memory write")
        vectors = check_embeddings(vectors, len(entries), self.dimension, "memory write")
        start = len(self.entries)
        ids = list(range(start, start + len(entries)))
        if entries:
            self._index.add_with_ids(vectors, np.asarray(ids, dtype=np.int64))
        self.entries.extend(entries)
        self._vectors.extend(vectors)
        self._live.update(ids)
        self._keys.update({k: i for k, i in zip(keys, ids, strict=True)})
        return ids

    def remove(self, keys: Sequence[str]) -> int:
        """Remove live entries by key (unknown keys are ignored); returns how many were removed."""
        ids = [self._keys[k] for k in keys if k in self._keys and self._keys[k] in self._live]
        if ids:
            self._index.remove_ids(np.asarray(ids, dtype=np.int64))  # type: ignore[arg-type]  # faiss accepts ids
            self._live.difference_update(ids)
        return len(ids)

    def live_entries(self) -> list[MemoryEntry]:
        return [self.entries[i] for i in sorted(self._live)]

    def vectors(self) -> np.ndarray:
        """The live entries' embeddings, in ``live_entries`` order."""
        if not self._live:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([self._vectors[i] for i in sorted(self._live)])

    def search(self, query_vectors: np.ndarray, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(similarities, entry ids) of the top-k live entries per query; ids are -1 past the end."""
        if not self._live:
            raise MemoryPoisoningInputError("the memory is empty: write entries before retrieving from it")
        queries = check_embeddings(query_vectors, len(query_vectors), self.dimension, "retrieval queries")
        return self._index.search(queries, min(k or self.top_k, len(self._live)))

    def retrieve(self, queries: Sequence[str], k: int | None = None) -> list[list[MemoryEntry]]:
        """The top-k entries for each query text, best first."""
        _, ids = self.search(embed_texts(self.embedder, queries, "retrieval queries"), k)
        return [[self.entries[i] for i in row if i >= 0] for row in ids]

    def retrieve_vectors(self, query_vectors: np.ndarray, k: int | None = None) -> list[list[MemoryEntry]]:
        _, ids = self.search(query_vectors, k)
        return [[self.entries[i] for i in row if i >= 0] for row in ids]


def _dupes(keys: Sequence[str]) -> set[str]:
    seen: set[str] = set()
    return {k for k in keys if k in seen or seen.add(k)}  # type: ignore[func-returns-value]


def build_memory(
    embedder: Embedder, entries: Sequence[MemoryEntry], *, vectors: np.ndarray | None = None, top_k: int = DEFAULT_TOP_K
) -> RetrievalMemory:
    """A memory holding ``entries``; an empty list is refused (nothing could be retrieved from it)."""
    if not entries:
        raise MemoryPoisoningInputError("cannot build a memory from zero entries: the corpus split is empty")
    memory = RetrievalMemory(embedder, top_k=top_k)
    memory.add(entries, vectors)
    return memory
