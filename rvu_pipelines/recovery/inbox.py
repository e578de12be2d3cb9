"""The incident inbox: where agent runtimes drop JSONL incident logs for recovery.

Layout under one root (RVU_INCIDENT_DIR, default .rvu/incidents):
  inbox/        new files land here
  accepted/     validated logs, content-addressed as <incident_id>.jsonl (the recovery job reads these)
  dead_letter/  malformed files, each with <name>.error.json beside it naming file, line and field

Triage moves a file only after its copy is safely written, so nothing is lost if it stops midway,
and the same content dropped twice maps to the same incident id (one recovery, not two).

Files come from outside and may be hostile, so each is triaged on its own: whatever one file is or
holds (a FIFO, a device, a symbolic link to a file elsewhere, a file over RVU_MAX_INPUT_MB, bytes that
break any later stage), it ends in dead_letter/ with the reason, and the files after it are still
triaged. A file that cannot even be moved (the disk is full) stays in the inbox with its error in the
outcome, to be tried again. Only a regular file inside inbox/ is read: links are moved, never followed,
and triage refuses to run while inbox/, accepted/ or dead_letter/ is itself a link.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.bounded_io import link_target, read_input_file, truncate_for_message
from rvu_pipelines.errors import ConfigError, IncidentValidationError, InputFileError
from rvu_pipelines.paths import INCIDENT_DIR_ENV, incident_inbox_dir
from rvu_pipelines.provenance.incident import MAX_ISSUES, parse_incident

MESSAGE_LIMIT = 4000  # characters of an error message kept in a dead-letter report


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

    @property
    def folders(self) -> tuple[Path, Path, Path]:
        return self.inbox, self.accepted, self.dead_letter

    def ensure(self) -> IncidentFolders:
        """Create the folders that are missing, then :meth:`check` them."""
        for folder in self.folders:
            if not os.path.lexists(folder):  # a dangling link is not created through: check() refuses it
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise ConfigError(f"Cannot create the incident folder {folder}: {exc.strerror or exc}.") from None
        return self.check()

    def check(self) -> IncidentFolders:
        """ConfigError unless inbox/, accepted/ and dead_letter/ are real folders inside the root: through a
        link, every copy and move triage makes would land in whatever folder the link names."""
        for folder in self.folders:
            try:
                info = os.lstat(folder)
            except OSError as exc:
                raise ConfigError(f"Incident folder {folder} cannot be used: {exc.strerror or exc}.") from None
            if stat.S_ISLNK(info.st_mode):
                raise ConfigError(
                    f"Incident folder {folder} is a symbolic link (to {link_target(folder)}); files triage moves or "
                    f"writes there would land outside {self.root}, so nothing was triaged. Replace it with a real "
                    f"folder (rm {folder} && mkdir {folder}), or point {INCIDENT_DIR_ENV} at the folder you mean."
                )
            if not stat.S_ISDIR(info.st_mode):
                raise ConfigError(
                    f"Incident folder {folder} is not a folder; move it away so it can be created (nothing was "
                    "triaged)."
                )
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
    chosen = Path(root) if root else incident_inbox_dir()
    return IncidentFolders(chosen.expanduser().resolve()).ensure()


@dataclass(frozen=True)
class TriageOutcome:
    """What became of one inbox file: accepted (``incident_id``), dead-lettered (``dead_letter``), or neither
    (``error`` only: it could not be moved and stays in the inbox for the next tick)."""

    source: str
    incident_id: str | None
    sha256: str | None
    error: str | None = None
    dead_letter: str | None = None

    @property
    def accepted(self) -> bool:
        return self.incident_id is not None


def _free_name(folder: Path, name: str) -> Path:
    candidate, n = folder / name, 1
    while os.path.lexists(candidate):  # a dangling symlink counts as taken too
        candidate, n = folder / f"{Path(name).stem}.{n}{Path(name).suffix}", n + 1
    return candidate


def _message(error: Exception) -> str:
    """The error's message, bounded; an unexpected error (not one of ours) is prefixed with its class."""
    message = str(error)
    if not isinstance(error, (IncidentValidationError, InputFileError)):
        message = f"{type(error).__name__}: {message}"
    if len(message) > MESSAGE_LIMIT:
        message = f"{message[:MESSAGE_LIMIT]}… ({len(message)} characters)"
    return message


def _report(name: str, error: Exception) -> dict[str, Any]:
    """The dead-letter report: the error class, its message (bounded), and the problems it lists (capped)."""
    message = _message(error)
    if isinstance(error, IncidentValidationError):
        problems = [issue.as_dict() for issue in error.issues[:MAX_ISSUES]]
    else:
        problems = [{"file": name, "line": 0, "field": "<file>", "message": message}]
    return {"file": name, "error": type(error).__name__, "message": message, "problems": problems}


def _dead_letter(folders: IncidentFolders, path: Path, error: Exception) -> TriageOutcome:
    """Move ``path`` (whatever it is: never opened here) beside a report saying why."""
    report = _report(path.name, error)
    target = _free_name(folders.dead_letter, path.name)
    write_atomically(
        target.with_name(target.name + ".error.json"), json.dumps(report, indent=1, sort_keys=True).encode()
    )
    os.replace(path, target)  # renames a FIFO, device node or symlink without opening it
    return TriageOutcome(path.name, None, None, report["message"], str(target))


def _accept(folders: IncidentFolders, path: Path) -> TriageOutcome:
    """Read (bounded, never blocking) and validate ``path``; keep a content-addressed copy if it is valid."""
    data = read_input_file(path, what="incident log", follow_links=False)  # a link is dead-lettered, not followed
    incident = parse_incident(data, path.name)
    accepted = folders.accepted_path(incident.incident_id)
    if not accepted.with_suffix(".sha256").exists():  # the .sha256 is written last: its presence means done
        write_atomically(accepted, data)
        write_atomically(accepted.with_suffix(".sha256"), incident.sha256.encode())
    path.unlink()
    return TriageOutcome(path.name, incident.incident_id, incident.sha256)


def _triage_one(folders: IncidentFolders, path: Path) -> TriageOutcome:
    """One file to accepted/ or dead_letter/; no exception escapes, so one file never blocks the others."""
    try:
        return _accept(folders, path)
    except ConfigError:  # the deployment is wrong (e.g. RVU_MAX_INPUT_MB), not the file: fail loudly, move nothing
        raise
    except Exception as error:  # noqa: BLE001 - whatever a hostile file causes, it is dead-lettered with its class
        failure = error
    try:
        return _dead_letter(folders, path, failure)
    except OSError as error:  # cannot move it (vanished, disk full): say so, leave it for the next tick
        reason = f"{_message(failure)}; and it could not be dead-lettered: {truncate_for_message(error)}"
        return TriageOutcome(path.name, None, None, reason)


def triage_inbox(folders: IncidentFolders) -> list[TriageOutcome]:
    """Triage each new file on its own: accept it (content-addressed copy) or dead-letter it with a report.

    Only regular files are read; a symbolic link is dead-lettered itself (moved, never followed).
    """
    folders.check()
    return [_triage_one(folders, path) for path in sorted(folders.inbox.glob("*.jsonl"))]
