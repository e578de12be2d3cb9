"""Vectors of provenance entries: the embedder that makes them and the FAISS index agents retrieve from.

The index is a cache of the store (ids = entry seqs): :meth:`VectorIndex.open` reconciles it with what
the store allows, so the tier actions in :mod:`tiers` only ever remove or re-add vectors around a store
commit and a crash never leaves an isolated vector retrievable.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from rvu_pipelines.atomic_write import atomic_path
from rvu_pipelines.errors import StoreError
from rvu_pipelines.provenance.intsets import unique_ints
from rvu_pipelines.provenance.store import ProvenanceStore

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------ vector index


@dataclass(frozen=True)
class ReconcileReport:
    removed: int
    added: int


class VectorIndex:
    """A FAISS ``IndexIDMap`` over inner product whose ids are entry seqs, kept in step with the store."""

    def __init__(self, path: Path | None, index: faiss.IndexIDMap) -> None:
        self.path = path
        self._index = index

    @property
    def dimension(self) -> int:
        return int(self._index.d)

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    @classmethod
    def open(cls, path: Path | str | None, store: ProvenanceStore, *, dimension: int | None = None) -> VectorIndex:
        """Load the index at ``path`` (or start an empty one) and reconcile it with ``store``."""
        dim = store.embedding_dim or dimension
        if dim is None:
            raise StoreError("The store holds no vectors yet and no dimension was given for the vector index.")
        target = Path(path) if path is not None else None
        index = None
        if target is not None and target.exists():
            try:
                loaded = faiss.read_index(str(target))
                if isinstance(loaded, faiss.IndexIDMap) and loaded.d == dim:
                    index = loaded
                else:
                    log.warning("vector index %s does not match the store (d=%s); rebuilding it", target, loaded.d)
            except RuntimeError as exc:
                log.warning("vector index %s is unreadable (%s); rebuilding it from the store", target, exc)
        if index is None:
            index = faiss.IndexIDMap(faiss.IndexFlatIP(dim))
        vector_index = cls(target, index)
        report = vector_index.reconcile(store)
        if report.removed or report.added:
            log.info("reconciled vector index %s: removed %d, added %d", target, report.removed, report.added)
        return vector_index

    def ids(self) -> np.ndarray:
        if self.ntotal == 0:
            return np.zeros(0, dtype=np.int64)
        return np.sort(faiss.vector_to_array(self._index.id_map).astype(np.int64))

    def contains(self, seqs: np.ndarray | Sequence[int]) -> np.ndarray:
        return np.isin(np.asarray(seqs, dtype=np.int64), self.ids())

    def remove(self, seqs: np.ndarray | Sequence[int]) -> int:
        seqs = np.ascontiguousarray(unique_ints(seqs))
        if seqs.size == 0 or self.ntotal == 0:
            return 0
        return int(self._index.remove_ids(seqs))  # type: ignore[arg-type]  # faiss's stubs omit the numpy form

    def add(self, seqs: np.ndarray | Sequence[int], vectors: np.ndarray) -> None:
        seqs = np.ascontiguousarray(np.asarray(seqs, dtype=np.int64))
        if seqs.size:
            self._index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), seqs)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Inner-product scores and entry seqs (-1 = none) of the ``k`` nearest stored vectors."""
        return self._index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)

    def save(self) -> None:
        """Write atomically: a crash leaves either the old file or the new one, never half of one."""
        if self.path is None:
            return
        with atomic_path(self.path) as temp:
            faiss.write_index(self._index, str(temp))

    def reconcile(self, store: ProvenanceStore) -> ReconcileReport:
        """Make the index hold exactly the vectors the store allows; save if anything changed."""
        allowed = store.allowed_vector_seqs()
        present = self.ids()
        extra = np.setdiff1d(present, allowed, assume_unique=True)
        missing = np.setdiff1d(allowed, present, assume_unique=True)
        removed = self.remove(extra)
        if missing.size:
            self.add(missing, store.vectors(missing))
        if removed or missing.size or (self.path is not None and not self.path.exists()):
            self.save()
        return ReconcileReport(removed=removed, added=int(missing.size))
