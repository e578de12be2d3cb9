"""Incident-log entry ids for names that come from elsewhere (memory keys, sessions), one-to-one.

An incident identifier is ``[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,127}``. A memory key or a session name can hold
anything, so it is escaped: characters outside the identifier alphabet (and ``+`` itself) become ``+XX`` per
UTF-8 byte, so ``note/1``, ``note_1`` and ``note?1`` stay apart; an id that would pass the 128-character
limit keeps its head and ends in ``++`` and 16 hex digits of the name's sha256 (a short id never holds ``++``).
"""

from __future__ import annotations

from rvu_pipelines.hashing import sha256_bytes
from rvu_pipelines.text_rules import digest_bytes

ID_LIMIT = 128  # the incident schema's identifier length
_ID_PUNCTUATION = "._:@/-"  # the identifier alphabet's punctuation, less the escape character +


def escaped_entry_id(prefix: str, name: str) -> str:
    """``<prefix>:<name escaped>``, at most 128 characters; distinct names give distinct ids."""
    escaped = "".join(
        c if c.isascii() and (c.isalnum() or c in _ID_PUNCTUATION) else "".join(f"+{b:02X}" for b in digest_bytes(c))
        for c in name
    )
    entry_id = f"{prefix}:{escaped}"
    if len(entry_id) <= ID_LIMIT:
        return entry_id
    digest = sha256_bytes(digest_bytes(name))[:16]
    return f"{entry_id[: ID_LIMIT - len(digest) - 2]}++{digest}"


def write_entry_id(key: str) -> str:
    """The entry id of the write of memory ``key``."""
    return escaped_entry_id("write", key)
