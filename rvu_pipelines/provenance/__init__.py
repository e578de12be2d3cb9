"""Provenance: the incident-log format, the provenance store (an interface, DuckDB behind it), closure.

Plain Python (no Dagster). Typical use::

    incident = load_incident("incident.jsonl")          # validates every line, raises on any problem
    with open_store("provenance.duckdb") as store:      # a ProvenanceStore (today: DuckDBProvenanceStore)
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
from rvu_pipelines.provenance.duckdb_store import DuckDBProvenanceStore
from rvu_pipelines.provenance.engines import open_store
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
from rvu_pipelines.provenance.store import (
    AdapterRow,
    ChainReport,
    EntryRow,
    Event,
    IngestResult,
    ManifestRow,
    ProvenanceStore,
)

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "AdapterRow",
    "ChainReport",
    "ClosureResult",
    "DuckDBProvenanceStore",
    "EntryRow",
    "Event",
    "IncidentIssue",
    "IncidentLog",
    "IncidentRecord",
    "IngestResult",
    "ManifestRow",
    "ProvenanceGraph",
    "ProvenanceStore",
    "closure_sizes",
    "closure_v1",
    "closure_v2",
    "load_incident",
    "open_store",
    "parse_incident",
    "reference_closure",
    "reference_closure_sizes",
    "schema_path",
    "write_incident",
]
