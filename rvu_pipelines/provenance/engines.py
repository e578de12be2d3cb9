"""Opening a provenance store: the one place that maps a location to a store engine.

Kept apart from :mod:`store` (the interface) so the interface never imports an implementation, and a
second engine (PostgreSQL) is one more branch here, not a change to recovery.
"""

from __future__ import annotations

from pathlib import Path

from rvu_pipelines.errors import StoreError
from rvu_pipelines.provenance.duckdb_store import DuckDBProvenanceStore
from rvu_pipelines.provenance.store import ProvenanceStore

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_store(location: Path | str, *, read_only: bool = False, lock_timeout_s: float = 30.0) -> ProvenanceStore:
    """Open (creating if needed) the store at ``location``: a DuckDB file path, ``":memory:"``, or a PostgreSQL
    URL (``postgresql://user@host:port/db?schema=name``; the scale profile).

    The one place that chooses an engine, so recovery, the CLI and the assets never name one.
    """
    text = str(location)
    if text.startswith(POSTGRES_SCHEMES):
        from rvu_pipelines.provenance.postgres_store import PostgresProvenanceStore

        return PostgresProvenanceStore.open(text, read_only=read_only, connect_timeout_s=lock_timeout_s)
    if "://" in text:
        raise StoreError(f"No provenance store engine for {text}: use a DuckDB file path or a postgresql:// URL.")
    return DuckDBProvenanceStore.open(location, read_only=read_only, lock_timeout_s=lock_timeout_s)


def describe_store(location: Path | str) -> str:
    """The location as it may appear in messages and run storage: a PostgreSQL URL's password replaced."""
    text = str(location)
    if text.startswith(POSTGRES_SCHEMES):
        from rvu_pipelines.provenance.postgres_location import redact

        return redact(text)
    return text


def store_exists(location: Path | str) -> bool:
    """Whether a store is already at ``location`` (a DuckDB file, or a PostgreSQL schema); ``":memory:"``: no."""
    text = str(location)
    if text == ":memory:":
        return False
    if text.startswith(POSTGRES_SCHEMES):
        from rvu_pipelines.provenance.postgres_location import schema_exists

        return schema_exists(text)
    return Path(text).is_file()
