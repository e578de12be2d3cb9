"""Where recovery keeps its state, shared by the CLI and the Dagster resource (default .rvu/recovery)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.paths import STATE_DIR_ENV, project_root, state_dir
from rvu_pipelines.settings import env_value

TRUST_FILE = "trusted_keys.txt"


@dataclass(frozen=True)
class RecoveryPaths:
    root: Path

    @classmethod
    def default(cls, root: str | Path | None = None, *, create: bool = True) -> RecoveryPaths:
        """The state folder (``root`` or the default). ``create=False`` for commands that only read
        (verify, restore, keys): they must not leave folders behind on a machine that never recovered."""
        if root:
            path = Path(root)
        elif create:
            path = state_dir() / "recovery"
        else:  # where state_dir() would point, without creating it
            override = env_value(STATE_DIR_ENV)
            path = (Path(override).resolve() if override else project_root() / ".rvu") / "recovery"
        if create:
            path.mkdir(parents=True, exist_ok=True)
        return cls(path.resolve())

    @property
    def store(self) -> Path | str:
        """The provenance store: ``RVU_PROVENANCE_STORE`` when set (a DuckDB file or a PostgreSQL URL shared by
        workers), else ``provenance.duckdb`` in this folder."""
        return env_value("RVU_PROVENANCE_STORE") or self.root / "provenance.duckdb"

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
