"""Where a PostgreSQL provenance store is: a libpq URL plus our ``schema`` parameter; and how to print it safely."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from rvu_pipelines.errors import StoreError

DEFAULT_SCHEMA = "rvu"


def split_location(location: str) -> tuple[str, str]:
    """(libpq URL without our ``schema`` parameter, schema name) of a store location."""
    parts = urlsplit(location)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((value for key, value in query if key == "schema"), DEFAULT_SCHEMA)
    if not schema.replace("_", "").isalnum() or not schema[0].isalpha():
        raise StoreError(
            f"Store schema {schema!r} in {redact(location)}: use letters, digits and '_' (a letter first)."
        )
    rest = urlencode([(key, value) for key, value in query if key != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema.lower()


def redact(location: str) -> str:
    """The location with any password replaced, for messages and ``store.path`` (never log a secret)."""
    parts = urlsplit(location)
    if parts.password is None:
        return location
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def schema_exists(location: str) -> bool:
    """Whether the store's schema exists on the server (StoreError if the server cannot be reached)."""
    import psycopg

    conninfo, schema = split_location(location)
    try:
        with psycopg.connect(conninfo, connect_timeout=10) as connection:
            return connection.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema]).fetchone() is not None
    except psycopg.OperationalError as exc:
        raise StoreError(f"Cannot connect to provenance store {redact(location)}: {exc}") from exc
