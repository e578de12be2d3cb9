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
