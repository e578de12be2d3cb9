"""Reading files that come from outside (incident logs, certificates) without trusting what they are.

A path may name a FIFO (open blocks forever), a device such as /dev/zero (read never ends), a symlink
to either, or a file larger than memory. ``read_input_file`` opens without blocking, checks the opened
descriptor is a regular file no larger than the limit (RVU_MAX_INPUT_MB, or a fixed limit the caller
gives with its reason), and reads at most limit + 1 bytes, so a file that grows while being read is
refused too. A path the user named on the command line may be a link (that is their choice); a file
that merely turned up in a watched folder is opened with ``follow_links=False``, so a link there
cannot make the platform read a file elsewhere.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from rvu_pipelines.errors import InputFileError
from rvu_pipelines.settings import max_input_bytes

MAX_INPUT_ENV = "RVU_MAX_INPUT_MB"


def read_input_file(
    path: str | Path,
    *,
    what: str,
    max_bytes: int | None = None,
    limit_reason: str = "",
    follow_links: bool = True,
) -> bytes:
    """The bytes of ``path``, a regular file within the limit; else :class:`InputFileError`.

    The limit is RVU_MAX_INPUT_MB unless ``max_bytes`` fixes it; ``limit_reason`` then says why it is
    fixed (the refusal quotes it instead of pointing at the variable, which would change nothing).
    ``follow_links=False`` refuses a symbolic link at ``path`` itself, atomically at open (O_NOFOLLOW).
    """
    path = Path(path)
    limit = max_input_bytes() if max_bytes is None else max_bytes
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputFileError(f"{what} {path}: no such file.") from None
    except IsADirectoryError:
        raise InputFileError(f"{what} {path}: is a folder; pass a file.") from None
    except OSError as exc:
        if not follow_links and exc.errno == errno.ELOOP and path.is_symlink():
            raise InputFileError(
                f"{what} {path}: is a symbolic link (to {link_target(path)}); links here are not followed, so "
                "only a regular file placed in the folder itself is read (copy the file in instead of linking it)."
            ) from None
        raise InputFileError(f"{what} {path}: cannot be opened ({exc.strerror}).") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(info.st_mode)
                else "a device"
                if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                else "a folder"
                if stat.S_ISDIR(info.st_mode)
                else "not a regular file"
            )
            raise InputFileError(f"{what} {path}: is {kind}; only regular files are read.")
        if info.st_size > limit:
            raise InputFileError(
                _too_large(what, path, info.st_size, limit, fixed=max_bytes is not None, why=limit_reason)
            )
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise InputFileError(
                _too_large(what, path, len(data), limit, fixed=max_bytes is not None, why=limit_reason)
            )
        return data
    finally:
        os.close(fd)


def link_target(path: Path) -> str:
    """Where a symbolic link points, for messages (read with readlink: the target is never opened)."""
    try:
        return truncate_for_message(os.readlink(path))
    except OSError:
        return "an unreadable target"


def _size(count: int) -> str:
    if count >= 2**20:
        return f"{count / 2**20:.1f} MiB"
    return f"{count / 2**10:.1f} KiB" if count >= 2**10 else f"{count} bytes"


def _too_large(what: str, path: Path, size: int, limit: int, *, fixed: bool, why: str) -> str:
    """The refusal; it names RVU_MAX_INPUT_MB only when that variable is the limit in force."""
    if not fixed:
        return (
            f"{what} {path}: {_size(size)} is over the {_size(limit)} limit; "
            f"raise {MAX_INPUT_ENV} if the file is expected to be this large."
        )
    reason = f" ({why})" if why else ""
    return f"{what} {path}: {_size(size)} is over the fixed {_size(limit)} limit for a {what}{reason}."


def truncate_for_message(value: object, limit: int = 200) -> str:
    """``repr`` of a value cut to ``limit`` characters with the full length said, for error messages."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 1]}… ({len(text)} characters)"
