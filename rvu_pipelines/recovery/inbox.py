"""The incident inbox: where agent runtimes drop JSONL incident logs for recovery.

Layout under one root (RVU_INCIDENT_DIR, default .rvu/incidents):
  inbox/        new files land here
  accepted/     validated logs, content-addressed as <incident_id>.jsonl (the recovery job reads these)
  dead_letter/  malformed files, each with <name>.error.json beside it naming file, line and field

Triage moves a file only after its copy is safely written, so nothing is lost if it stops midway,
and the same content dropped twice maps to the same incident id (one recovery, not two).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rvu_pipelines.errors import IncidentValidationError
from rvu_pipelines.paths import state_dir
from rvu_pipelines.provenance.incident import parse_incident
from rvu_pipelines.settings import env_value

INCIDENT_DIR_ENV = "RVU_INCIDENT_DIR"


@dataclass(frozen=True)
class IncidentFolders:
    root: Path

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    @property
    def accepted(self) -> Path:
        return self.root / "accepted"

    @property
    def dead_letter(self) -> Path:
        return self.root / "dead_letter"

    def ensure(self) -> IncidentFolders:
        for folder in (self.inbox, self.accepted, self.dead_letter):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    def accepted_path(self, incident_id: str) -> Path:
        return self.accepted / f"{incident_id}.jsonl"

    def accepted_incidents(self) -> list[tuple[str, str]]:
        """(incident_id, sha256) of every accepted log, sorted by id."""
        found = []
        for path in sorted(self.accepted.glob("inc-*.jsonl")):
            sha_path = path.with_suffix(".sha256")
            if sha_path.is_file():
                found.append((path.stem, sha_path.read_text().strip()))
        return found


def incident_folders(root: str | Path | None = None) -> IncidentFolders:
    chosen = Path(root) if root else Path(env_value(INCIDENT_DIR_ENV) or state_dir() / "incidents")
    return IncidentFolders(chosen.expanduser().resolve()).ensure()


@dataclass(frozen=True)
class TriageOutcome:
    source: str
    incident_id: str | None
    sha256: str | None
    error: str | None = None


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _free_name(folder: Path, name: str) -> Path:
    candidate, n = folder / name, 1
    while candidate.exists():
        candidate, n = folder / f"{Path(name).stem}.{n}{Path(name).suffix}", n + 1
    return candidate


def triage_inbox(folders: IncidentFolders) -> list[TriageOutcome]:
    """Validate each new file: accept it (content-addressed copy) or dead-letter it with a report."""
    outcomes = []
    for path in sorted(folders.inbox.glob("*.jsonl")):
        data = path.read_bytes()
        try:
            incident = parse_incident(data, path.name)
        except IncidentValidationError as error:
            target = _free_name(folders.dead_letter, path.name)
            report = {"file": path.name, "problems": [issue.as_dict() for issue in error.issues], "message": str(error)}
            _write_atomically(
                target.with_name(target.name + ".error.json"), json.dumps(report, indent=1, sort_keys=True).encode()
            )
            path.replace(target)
            outcomes.append(TriageOutcome(path.name, None, None, str(error)))
            continue
        accepted = folders.accepted_path(incident.incident_id)
        if not accepted.with_suffix(".sha256").exists():  # the .sha256 is written last: its presence means done
            _write_atomically(accepted, data)
            _write_atomically(accepted.with_suffix(".sha256"), incident.sha256.encode())
        path.unlink()
        outcomes.append(TriageOutcome(path.name, incident.incident_id, incident.sha256))
    return outcomes
