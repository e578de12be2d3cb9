"""The provenance store interface: what recovery may ask of a store, and the rows a store hands back.

Recovery, the tier actions and the vector index depend on :class:`ProvenanceStore` (a Protocol), never
on an engine or on SQL; :func:`engines.open_store` picks the engine for a location. Today that is DuckDB
(:mod:`duckdb_store`, all SQL lives there); a PostgreSQL store implements the same methods, returns
the same rows and can then run the same test suite. Sets of entries and adapters are sorted int64
numpy arrays of *seqs* (dense ids in ingest order), so a million-entry closure never becomes strings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from rvu_pipelines.provenance.closure import ProvenanceGraph
from rvu_pipelines.provenance.incident import IncidentLog


@dataclass(frozen=True)
class IngestResult:
    """What an ingest did: new rows, rows already present (same content), and every entry's seq."""

    incident_id: str
    new_entries: int
    already_present: int
    new_adapters: int
    seqs: np.ndarray  # seq of each record of the incident, in file order


@dataclass(frozen=True)
class EntryRow:
    seq: int
    entry_id: str
    episode_id: str
    action_type: str
    content: str
    content_hash: str
    parent_id: str | None
    timestamp: float
    tainted: bool
    purged: bool
    active_adapter_id: str | None
    contamination_score: float
    quarantined: bool


@dataclass(frozen=True)
class AdapterRow:
    seq: int
    adapter_id: str
    adapter_name: str
    adapter_hash: str
    source: str
    loaded_at: float | None
    unloaded_at: float | None
    fused: bool
    tainted: bool
    purged: bool
    influence: float | None
    episode_id: str | None
    load_entry_id: str | None


@dataclass(frozen=True)
class Event:
    seq: int
    kind: str
    subject_type: str
    subjects: list[int]
    details: dict[str, Any]
    created_at_us: int
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class ChainReport:
    """Result of :meth:`ProvenanceStore.verify_event_chain`."""

    ok: bool
    events: int
    head: str
    problem: str = ""


@dataclass(frozen=True)
class ManifestRow:
    """One entry as a certificate's manifest lists it: what it was, its content hash, its adapter."""

    seq: int
    entry_id: str
    content_hash: str
    action_type: str
    active_adapter_id: str | None


@runtime_checkable
class ProvenanceStore(Protocol):
    """A provenance store: entries, adapters, quarantines, vectors and a hash-chained event log.

    Every state change is idempotent (it returns only what actually changed and logs only that) and
    happens inside :meth:`transaction`, so a crash or a failed write leaves nothing half done.
    """

    path: str

    # ---------------------------------------------------------------- lifecycle

    def close(self) -> None: ...

    def __enter__(self) -> ProvenanceStore: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None: ...

    def transaction(self) -> AbstractContextManager[None]:
        """All writes inside happen or none do; nested uses join the outer transaction."""
        ...

    # ---------------------------------------------------------------- reads

    @property
    def entry_count(self) -> int: ...

    @property
    def adapter_count(self) -> int: ...

    @property
    def embedding_dim(self) -> int | None:
        """Dimension of the stored vectors; None until a first ingest stored some."""
        ...

    @property
    def embedder_name(self) -> str | None: ...

    def graph(self) -> ProvenanceGraph:
        """The provenance DAG (parent and adapter of every entry) as integer arrays indexed by seq."""
        ...

    def contamination_scores(self) -> np.ndarray:
        """P(contaminated | e) of every entry, indexed by seq."""
        ...

    def adapter_influence(self) -> np.ndarray:
        """The influence recorded for each adapter (0 where none), indexed by adapter seq."""
        ...

    def seqs_of(self, entry_ids: Sequence[str]) -> np.ndarray:
        """seq of each entry id, in the given order; EntryNotFoundError for an unknown id."""
        ...

    def incident_seqs(self, incident: IncidentLog) -> np.ndarray:
        """seq of each record of an ingested incident, in file order."""
        ...

    def entry_ids(self, seqs: Sequence[int] | np.ndarray) -> list[str]:
        """Entry ids for the given seqs, in the given order."""
        ...

    def adapter_ids(self, seqs: Sequence[int] | np.ndarray) -> list[str]:
        """Adapter ids for the given adapter seqs, in the given order."""
        ...

    def entry(self, entry_id: str) -> EntryRow:
        """One entry with its state; EntryNotFoundError for an unknown id."""
        ...

    def adapters(self, seqs: Sequence[int] | np.ndarray | None = None) -> list[AdapterRow]:
        """Adapter rows (all, or those with the given seqs), ordered by seq."""
        ...

    def entry_states(self, seqs: np.ndarray) -> dict[str, np.ndarray]:
        """``tainted`` / ``quarantined`` (active) / ``purged`` flags for the given seqs, in the given order."""
        ...

    def manifest(self, seqs: Sequence[int] | np.ndarray) -> list[ManifestRow]:
        """Manifest rows of the given entry seqs, in the given order; EntryNotFoundError for an unknown seq."""
        ...

    # ---------------------------------------------------------------- writes

    def ingest(
        self,
        incident: IncidentLog,
        *,
        contamination: Mapping[str, float] | None = None,
        vectors: np.ndarray | None = None,
        embedder: str | None = None,
    ) -> IngestResult:
        """Write a validated incident, all of it or nothing; re-ingesting the same file changes nothing."""
        ...

    def mark_tainted(self, seqs: np.ndarray | Sequence[int], details: Mapping[str, Any]) -> np.ndarray:
        """Taint entries; returns (and logs) the seqs that changed."""
        ...

    def mark_adapters_tainted(self, adapter_seqs: np.ndarray | Sequence[int], details: Mapping[str, Any]) -> np.ndarray:
        """Taint adapters; returns (and logs) the adapter seqs that changed."""
        ...

    def quarantine(
        self, seqs: np.ndarray | Sequence[int], risk: np.ndarray | Sequence[float], details: Mapping[str, Any]
    ) -> np.ndarray:
        """Quarantine entries neither purged nor already under an active quarantine; returns those."""
        ...

    def purge(self, seqs: np.ndarray | Sequence[int], details: Mapping[str, Any]) -> np.ndarray:
        """Purge entries (irreversible); returns the seqs that changed."""
        ...

    def evict_adapters(
        self, adapter_seqs: np.ndarray | Sequence[int], details: Mapping[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Evict adapters and mark them unloaded; returns (evicted, newly unloaded)."""
        ...

    def restore(self, entry_id: str, details: Mapping[str, Any] | None = None) -> bool:
        """Lift an active quarantine; False if already restored, RestoreError if impossible."""
        ...

    def record_gate_verdict(self, decision: Literal["admitted", "refused"], details: Mapping[str, Any]) -> None:
        """Log an adapter gate's verdict outside any incident (event ``adapter_admitted`` / ``adapter_refused``)."""
        ...

    # ---------------------------------------------------------------- vectors

    def allowed_vector_seqs(self) -> np.ndarray:
        """Entries whose vector may be retrievable: stored, not purged, not under an active quarantine."""
        ...

    def has_vector(self, seq: int) -> bool: ...

    def vectors(self, seqs: np.ndarray | Sequence[int]) -> np.ndarray:
        """Stored vectors for the given seqs (float32 rows, in the given order)."""
        ...

    # ---------------------------------------------------------------- event log

    def events(self, kind: str | None = None) -> list[Event]: ...

    def events_for_entry(self, entry_id: str) -> list[Event]: ...

    def verify_event_chain(self) -> ChainReport:
        """Recompute every event hash and link; any edit, deletion or reordering breaks the chain."""
        ...
