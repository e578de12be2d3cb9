"""Provenance: the incident-log format, the DuckDB provenance store, and contamination closure.

Plain Python (no Dagster). Typical use::

    incident = load_incident("incident.jsonl")          # validates every line, raises on any problem
    with ProvenanceStore.open("provenance.duckdb") as store:
        store.ingest(incident, contamination=..., vectors=...)
        graph = store.graph()
        v2 = closure_v2(graph, seeds)                     # adapter-aware (Theorem 2c)
"""

from rvu_pipelines.provenance.closure import (
    DEFAULT_MAX_DEPTH,
    ClosureResult,
    ProvenanceGraph,
    closure_v1,
    closure_v2,
    reference_closure,
    reference_closure_sizes,
)
from rvu_pipelines.provenance.duckdb_store import ProvenanceStore
from rvu_pipelines.provenance.incident import (
    IncidentIssue,
    IncidentLog,
    IncidentRecord,
    load_incident,
    parse_incident,
    schema_path,
    write_incident,
)
from rvu_pipelines.provenance.propagation import closure_sizes
from rvu_pipelines.provenance.store import AdapterRow, ChainReport, EntryRow, Event, IngestResult

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "AdapterRow",
    "ChainReport",
    "ClosureResult",
    "EntryRow",
    "Event",
    "IncidentIssue",
    "IncidentLog",
    "IncidentRecord",
    "IngestResult",
    "ProvenanceGraph",
    "ProvenanceStore",
    "closure_sizes",
    "closure_v1",
    "closure_v2",
    "load_incident",
    "parse_incident",
    "reference_closure",
    "reference_closure_sizes",
    "schema_path",
    "write_incident",
]
