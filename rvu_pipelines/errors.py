"""User-facing errors.

Every error a user can cause (bad config, missing data, wrong checksum) is an ``RvuError`` whose
message says what went wrong, where, and how to fix it, so the CLI can print it without a traceback.
"""

from __future__ import annotations


class RvuError(Exception):
    """An error with a message meant for the user, not a stack trace."""


class ConfigError(RvuError):
    """A YAML config or environment value is invalid."""


class DatasetUnavailableError(RvuError):
    """A data set can be read neither from the mirror nor from its public source."""


class ModelUnavailableError(RvuError):
    """A model cannot be resolved from any of its configured sources."""


class ChecksumMismatchError(RvuError):
    """A file's sha256 differs from the pinned value; it is refused, never loaded."""

    def __init__(self, what: str, path: str, expected: str, actual: str, fix: str = "") -> None:
        self.expected = expected
        self.actual = actual
        message = (
            f"{what}: sha256 mismatch for {path}\n  expected {expected}\n  actual   {actual}\n"
            "The file was refused and not loaded."
        )
        if fix:
            message += f" {fix}"
        super().__init__(message)


# ---- memory reference monitor (rvu_pipelines.memory). Rule rejections are Decisions, not errors;
# these are malformed calls and integrity failures.


class MemoryMonitorError(RvuError):
    """A call to the memory reference monitor was malformed (a rule rejection is a Decision, not this)."""


class ProvenanceError(MemoryMonitorError):
    """A provenance label did not come from the runtime (e.g. a string the model produced)."""


class NamespaceError(MemoryMonitorError):
    """A session or namespace name is empty, or a session tried to act as the shared namespace."""


class UnknownBeliefError(MemoryMonitorError):
    """A dependency names a belief node that does not exist (yet)."""


class GenesisClosedError(MemoryMonitorError):
    """Items can be installed only into S_0, before the monitor decided anything."""


class UserChannelError(MemoryMonitorError):
    """A USER-channel write or promotion bypassed the §9.5 review (e.g. inside a batch)."""


class AuditIntegrityError(RvuError):
    """The hash-chained audit log does not verify: a record was altered, removed or reordered."""


class IncidentValidationError(RvuError):
    """An incident log failed validation; nothing from it was ingested.

    ``issues`` holds one object per problem with ``file``, ``line``, ``field`` and ``message``
    attributes, so callers (CLI, sensor dead-letter report) can print or serialise them.
    """

    def __init__(self, path: str, issues: list) -> None:  # list of IncidentIssue
        self.path = path
        self.issues = list(issues)
        shown = "\n".join(f"  {issue}" for issue in self.issues[:50])
        more = f"\n  ... and {len(self.issues) - 50} more" if len(self.issues) > 50 else ""
        super().__init__(
            f"Incident log {path} is invalid ({len(self.issues)} problem(s)); nothing was ingested:\n{shown}{more}"
        )


class InputFileError(RvuError):
    """A file handed to the platform (incident log, certificate) that it refuses to read: not a regular
    file, too large, or unreadable. The message names the path and the fix."""


class StoreError(RvuError):
    """The provenance store or its vector index cannot be opened or used as asked."""


class EntryNotFoundError(StoreError):
    """An entry id names no entry in the provenance store."""


class RestoreError(RvuError):
    """A quarantine cannot be lifted (the entry is purged, or was never quarantined)."""


class SigningKeyError(RvuError):
    """The certificate signing key cannot be created or read."""


# ---- injection detectors (rvu_pipelines.detectors)


class DetectorError(RvuError):
    """A detector was asked for something it cannot do (unknown corpus, bad input, unloadable weights)."""


class UnsafePickleError(DetectorError):
    """A pickle referenced a class outside the allow-list, or carried an unexpected state; refused unbuilt."""


class RegisteredDetectorError(DetectorError):
    """A detector is missing from the MLflow model registry, or its registered files cannot be loaded."""


# ---- memory poisoning (rvu_pipelines.memory_poisoning): malformed memories, embeddings, calibrations


class MemoryPoisoningInputError(RvuError):
    """A retrieval memory, embedding matrix or calibration set cannot be used as given (the message says why)."""
