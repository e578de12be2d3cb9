"""What a recovery creates before its incident is ingested, checked first and undone on refusal.

A first recovery on a fresh state folder creates the signing key and the store file. A log the store then
refuses must leave neither behind: it is checked against an empty store before anything exists
(:func:`check_against_new_store`), and if the ingest still refuses it, :class:`MadeBeforeIngest` removes
what this run created, and only that.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.provenance.engines import store_exists
from rvu_pipelines.provenance.incident import IncidentLog
from rvu_pipelines.provenance.ingest_plan import validate as validate_against_store
from rvu_pipelines.provenance.store import ProvenanceStore
from rvu_pipelines.recovery.signing_keys import PRIVATE_KEY_FILE, PUBLIC_KEY_FILE, SigningKey


def check_against_new_store(incident: IncidentLog, store_path: Path | str) -> None:
    """IncidentValidationError now, before anything is created, for a log that a store which does not exist yet
    would refuse at ingest: a new store holds no entry or adapter, so every parent or adapter the log names
    without defining it is refused (file, line and field). An existing store is checked at ingest instead."""
    if store_exists(store_path):
        return
    validate_against_store(incident, existing={}, parents={}, adapters={})


@dataclass
class MadeBeforeIngest:
    """What this run created before its incident was ingested: the signing key (and its folder) and a new
    DuckDB store file. :func:`undone_unless_ingested` removes them when the ingest does not happen, so a
    refused log leaves no key and no empty store behind. A file that existed before the run is never
    touched, and a store is removed only if this run found it new and still empty once it held its lock."""

    key_folder: Path
    key_folder_existed: bool
    store_is_new: bool
    store_file: Path | None = None  # set by claim_store: the new, empty DuckDB file this run opened
    key: SigningKey | None = None
    ingested: bool = False

    @classmethod
    def before(cls, store_path: Path | str, key_dir: Path | str) -> MadeBeforeIngest:
        is_new = str(store_path) != ":memory:" and not store_exists(store_path)
        return cls(Path(key_dir), Path(key_dir).exists(), is_new)

    def claim_store(self, store_path: Path | str, store: ProvenanceStore) -> None:
        """Own the store file if it is a DuckDB file that did not exist before this run and holds nothing
        (PostgreSQL schemas are never dropped here)."""
        text = str(store_path)
        if self.store_is_new and "://" not in text and not store.entry_count:
            self.store_file = Path(text)

    def undo(self) -> None:
        if self.store_file is not None:
            for path in (self.store_file, self.store_file.with_name(self.store_file.name + ".wal")):
                path.unlink(missing_ok=True)
        if self.key is not None and self.key.created:
            for name in (PRIVATE_KEY_FILE, PUBLIC_KEY_FILE):
                (self.key_folder / name).unlink(missing_ok=True)
            if not self.key_folder_existed:
                with contextlib.suppress(OSError):  # only an empty folder is removed
                    self.key_folder.rmdir()


@contextlib.contextmanager
def undone_unless_ingested(made: MadeBeforeIngest) -> Iterator[MadeBeforeIngest]:
    try:
        yield made
    except BaseException:
        if not made.ingested:
            made.undo()
        raise
