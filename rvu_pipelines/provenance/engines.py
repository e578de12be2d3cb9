"""Opening a provenance store: the one place that maps a location to a store engine.

Kept apart from :mod:`store` (the interface) so the interface never imports an implementation, and a
second engine (PostgreSQL) is one more branch here, not a change to recovery.
"""

from __future__ import annotations

from pathlib import Path

from rvu_pipelines.errors import StoreError
from rvu_pipelines.provenance.duckdb_store import DuckDBProvenanceStore
from rvu_pipelines.provenance.store import ProvenanceStore


def open_store(location: Path | str, *, read_only: bool = False, lock_timeout_s: float = 30.0) -> ProvenanceStore:
    """Open (creating if needed) the store at ``location``: a DuckDB file path, or ``":memory:"``.

    The one place that chooses an engine, so recovery, the CLI and the assets never name one.
    """
    if "://" in str(location):
        raise StoreError(f"No provenance store engine for {location}: only DuckDB file paths are supported so far.")
    return DuckDBProvenanceStore.open(location, read_only=read_only, lock_timeout_s=lock_timeout_s)
