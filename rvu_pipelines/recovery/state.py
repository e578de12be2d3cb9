"""Where recovery keeps its state, shared by the CLI and the Dagster resource (default .rvu/recovery)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.paths import state_dir


@dataclass(frozen=True)
class RecoveryPaths:
    root: Path

    @classmethod
    def default(cls, root: str | Path | None = None) -> RecoveryPaths:
        path = Path(root) if root else state_dir() / "recovery"
        path.mkdir(parents=True, exist_ok=True)
        return cls(path.resolve())

    @property
    def store(self) -> Path:
        return self.root / "provenance.duckdb"

    @property
    def index(self) -> Path:
        return self.root / "index.faiss"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    def certificate(self, incident_id: str) -> Path:
        folder = self.root / "certificates"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{incident_id}.json"
