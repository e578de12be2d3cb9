"""Where recovery keeps its state, shared by the CLI and the Dagster resource (default .rvu/recovery)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.paths import shared_provenance_store, state_dir

TRUST_FILE = "trusted_keys.txt"


@dataclass(frozen=True)
class RecoveryPaths:
    root: Path
    shared_store: str | None = None  # a store shared by workers (paths.shared_provenance_store), else a file here

    @classmethod
    def default(cls, root: str | Path | None = None, *, create: bool = True) -> RecoveryPaths:
        """The state folder (``root`` or the default). ``create=False`` for commands that only read
        (verify, restore, keys): they must not leave folders behind on a machine that never recovered."""
        path = Path(root) if root else state_dir(create=create) / "recovery"
        if create:
            path.mkdir(parents=True, exist_ok=True)
        return cls(path.resolve(), shared_provenance_store())

    @property
    def store(self) -> Path | str:
        """The provenance store: the shared one when set (a DuckDB file or a PostgreSQL URL shared by workers,
        ``RVU_PROVENANCE_STORE``), else ``provenance.duckdb`` in this folder."""
        return self.shared_store or self.root / "provenance.duckdb"

    @property
    def index(self) -> Path:
        return self.root / "index.faiss"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def certificates(self) -> Path:
        return self.root / "certificates"

    @property
    def trust_file(self) -> Path:
        """Fingerprints an auditor trusts on this machine (one per line, # comments); read if present."""
        return self.root / TRUST_FILE

    def certificate(self, incident_id: str) -> Path:
        self.certificates.mkdir(parents=True, exist_ok=True)
        return self.certificates / f"{incident_id}.json"
