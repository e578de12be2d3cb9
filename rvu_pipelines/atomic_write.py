"""Atomic file writes that never follow a link planted in the target's folder.

The usual shape, ``open(path + ".tmp", "w")`` then ``os.replace``, opens a *predictable* name: anyone
who can write to the folder can plant ``cert.json.tmp -> ../victim.txt`` and the platform writes its
output into the victim, then renames the link into place. Here the temporary file is created by
``tempfile.mkstemp`` (``O_CREAT | O_EXCL`` under a random name, mode 0600), so it is always a new regular
file the process made itself; its permissions are set through the open descriptor (never by name, which
would follow a link swapped in meanwhile); ``os.replace`` then swaps the directory entry, so a link
standing at the target is replaced, never written through. A failure at any point removes the temporary
file and leaves the old target as it was.

Permissions: ``mode`` is filtered by the process umask as ``open()`` would do, so a deployment with
``umask 077`` keeps its files private; ``mode=None`` keeps mkstemp's 0600 (secrets).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

NAME_CHARS_IN_TEMP = 64  # of the target's name in the temp name: keeps it under NAME_MAX for any target


def _umask() -> int:
    """The process umask, read without changing it where /proc says it (Linux); else set and reset."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    current = os.umask(0o022)
    os.umask(current)
    return current


def _temp_in(folder: Path, name: str) -> tuple[int, Path]:
    descriptor, temp = tempfile.mkstemp(prefix=f".{name[:NAME_CHARS_IN_TEMP]}.", suffix=".tmp", dir=folder)
    return descriptor, Path(temp)


def _finish(descriptor: int, mode: int | None, fsync: bool) -> None:
    """Permissions and durability through the descriptor of the file itself."""
    if mode is not None:
        os.fchmod(descriptor, mode & ~_umask())
    if fsync:
        os.fsync(descriptor)


def _publish(temp: Path, path: Path, fsync: bool) -> None:
    os.replace(temp, path)
    if fsync:  # the rename itself survives a power loss only once the folder is on disk
        with contextlib.suppress(OSError):
            folder = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                os.fsync(folder)
            finally:
                os.close(folder)


@contextlib.contextmanager
def atomic_writer(path: Path | str, *, mode: int | None = 0o644, fsync: bool = True) -> Iterator[BinaryIO]:
    """A binary file object whose content replaces ``path`` when the block ends without an exception.

    ``mode`` is the published file's permission bits before the umask (``None`` keeps 0600, for secrets);
    ``fsync=False`` for caches, where a file lost to a power cut is only recomputed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temp = _temp_in(path.parent, path.name)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            yield handle
            handle.flush()
            _finish(handle.fileno(), mode, fsync)
        _publish(temp, path, fsync)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise


@contextlib.contextmanager
def atomic_path(path: Path | str, *, mode: int | None = 0o644, fsync: bool = True) -> Iterator[Path]:
    """A fresh temporary path beside ``path`` for writers that need a file name (parquet, faiss, a
    library's ``save``); it replaces ``path`` when the block ends without an exception.

    The writer must write to exactly this name (a library that appends its own suffix would miss it);
    what it left there is reopened without following links before it is published.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temp = _temp_in(path.parent, path.name)
    os.close(descriptor)
    try:
        yield temp
        written = os.open(temp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            _finish(written, mode, fsync)
        finally:
            os.close(written)
        _publish(temp, path, fsync)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise


def write_atomically(path: Path | str, data: bytes | str, *, mode: int | None = 0o644, fsync: bool = True) -> Path:
    """Replace ``path`` with ``data`` (str is written as UTF-8) in one step; see the module docstring."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_writer(path, mode=mode, fsync=fsync) as handle:
        handle.write(payload)
    return Path(path)


def write_stream_atomically(
    path: Path | str, write: Callable[[BinaryIO], object], *, mode: int | None = 0o644, fsync: bool = True
) -> Path:
    """Replace ``path`` with what ``write`` puts into a binary file object, in one step: for writers that take a
    file object (a polars frame's ``write_parquet`` / ``write_csv``, a figure's ``savefig`` with its ``format``,
    ``np.savez``), so a failure midway leaves the old file whole and a link at ``path`` is replaced, not followed."""
    with atomic_writer(path, mode=mode, fsync=fsync) as handle:
        write(handle)
    return Path(path)
