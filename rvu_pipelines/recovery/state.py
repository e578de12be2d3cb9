"""Where recovery keeps its state, shared by the CLI and the Dagster resource (default .rvu/recovery)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.paths import shared_provenance_store, state_dir

TRUST_FILE = "trusted_keys.txt"


@dataclass(frozen=True)
class RecoveryFiles:
    """Where one recovery reads and writes.

    ``store``: the provenance store (a DuckDB file, ``:memory:`` or a PostgreSQL URL); ``keys``: the signing key
    folder; ``certificate``: where this recovery's certificate goes; ``index``: the vector index (None: no
    index); ``certificates``: the folder of earlier certificates, so a lost signing key is noticed there too."""

    store: Path | str
    keys: Path
    certificate: Path
    index: Path | None = None
    certificates: Path | None = None

    def __init__(
        self,
        store: Path | str,
        keys: Path | str,
        certificate: Path | str,
        *,
        index: Path | str | None = None,
        certificates: Path | str | None = None,
    ) -> None:
        object.__setattr__(self, "store", store)
        object.__setattr__(self, "keys", Path(keys))
        object.__setattr__(self, "certificate", Path(certificate))
        object.__setattr__(self, "index", Path(index) if index is not None else None)
        object.__setattr__(self, "certificates", Path(certificates) if certificates is not None else None)


@dataclass(frozen=True)
class RecoveryPaths:
    """A recovery state folder: one store, index and signing key for every incident, one certificate each."""

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

    def files_for(self, incident_id: str, certificate: Path | str | None = None) -> RecoveryFiles:
        """What one recovery of ``incident_id`` uses in this folder (``certificate`` overrides where it goes)."""
        return RecoveryFiles(
            self.store,
            self.keys,
            certificate if certificate is not None else self.certificate(incident_id),
            index=self.index,
            certificates=self.certificates,
        )
