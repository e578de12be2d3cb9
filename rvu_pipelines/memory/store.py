"""Persistent namespace-keyed memory store (Assumption A4): DuckDB by default, a dict for tests.

The monitor decides on its in-memory index and writes accepted changes through to the store on
``flush()``; the store never decides anything, it only keeps M_t across restarts. The primary key
(namespace, key) is what makes the store namespace-keyed, the property Part III relies on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from rvu_pipelines.memory.model import Channel, MemoryItem
from rvu_pipelines.paths import state_dir
from rvu_pipelines.text_rules import check_text


def default_memory_db() -> Path:
    """Where the platform keeps agent memory and its audit log (inside the git-ignored state dir)."""
    path = state_dir() / "memory" / "memory.duckdb"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class MemoryStore(Protocol):
    """What the monitor needs from persistence: load M_0, upsert accepted changes."""

    def load(self) -> list[MemoryItem]: ...

    def upsert(self, items: Sequence[MemoryItem]) -> None: ...

    def close(self) -> None: ...


class InMemoryStore:
    """A dict keyed by (namespace, key): no persistence, for tests and benchmarks."""

    def __init__(self, items: Sequence[MemoryItem] = ()) -> None:
        self._items: dict[tuple[str, str], MemoryItem] = {(i.namespace, i.key): i for i in items}

    def load(self) -> list[MemoryItem]:
        return [self._items[k] for k in sorted(self._items)]

    def upsert(self, items: Sequence[MemoryItem]) -> None:
        for item in items:
            self._items[(item.namespace, item.key)] = item

    def close(self) -> None:
        return None


class DuckDBStore:
    """Items in a DuckDB table with PRIMARY KEY (namespace, key); ``path=None`` is in-memory DuckDB."""

    TABLE = "memory_items"

    def __init__(self, path: Path | str | None = None, *, connection: Any = None) -> None:
        import duckdb

        if connection is None:
            if path is not None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            connection = duckdb.connect(":memory:" if path is None else str(path))
            self._owns = True
        else:
            self._owns = False
        self.connection = connection
        self.connection.execute(
            f"CREATE TABLE IF NOT EXISTS {self.TABLE} (namespace VARCHAR NOT NULL, key VARCHAR NOT NULL, "
            "value VARCHAR NOT NULL, channel VARCHAR NOT NULL, tainted BOOLEAN NOT NULL, "
            "immutable BOOLEAN NOT NULL, PRIMARY KEY (namespace, key))"
        )

    def load(self) -> list[MemoryItem]:
        rows = self.connection.execute(
            f"SELECT namespace, key, value, channel, tainted, immutable FROM {self.TABLE} ORDER BY namespace, key"
        ).fetchall()
        return [
            MemoryItem(ns, key, value, Channel[channel], bool(t), bool(i)) for ns, key, value, channel, t, i in rows
        ]

    def upsert(self, items: Sequence[MemoryItem]) -> None:
        """Insert or replace ``items`` in one statement; a value no store can hold refuses them all first."""
        if not items:
            return
        for item in items:
            for what, text in (("namespace", item.namespace), ("key", item.key), ("value", item.value)):
                check_text(text, f"memory item {item.namespace!a}/{item.key!a}: {what}")
        import polars as pl

        frame = pl.DataFrame(
            {
                "namespace": [i.namespace for i in items],
                "key": [i.key for i in items],
                "value": [i.value for i in items],
                "channel": [i.channel.name for i in items],
                "tainted": [bool(i.tainted) for i in items],
                "immutable": [bool(i.immutable) for i in items],
            }
        )
        self.connection.register("_rvu_memory_incoming", frame)
        try:
            self.connection.execute(f"INSERT OR REPLACE INTO {self.TABLE} SELECT * FROM _rvu_memory_incoming")
        finally:
            self.connection.unregister("_rvu_memory_incoming")

    def close(self) -> None:
        if self._owns:
            self.connection.close()
