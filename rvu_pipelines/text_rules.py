"""The one rule for text the platform stores or logs: it must be encodable as UTF-8.

Memory items, audit records, incident logs, provenance entries and certificates all end up as UTF-8
in DuckDB, PostgreSQL or a file. A Python ``str`` holding a lone UTF-16 surrogate (``"\\ud800"``, as
``json.loads`` produces from ``"\\ud800"`` and a tokenizer's byte fallback can) cannot get there: no
UTF-8 encoder accepts it, so an unchecked value fails late, when it is written, after it was accepted
and beside other values queued with it. Every surface that takes text from outside checks it here,
before anything is stored, so such a value is refused where it arrives, with a message naming it.

NUL is valid Unicode and DuckDB keeps it; PostgreSQL ``TEXT`` cannot, so the PostgreSQL provenance
store refuses it by line at ingest, before it writes anything.
"""

from __future__ import annotations

import re

from rvu_pipelines.errors import RvuError

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
QUOTE_LIMIT = 60


class InvalidTextError(RvuError, ValueError):
    """A text cannot be stored: not a str, or not valid Unicode. The message names what and where."""


def _quote(text: str) -> str:
    """A hostile value cut short for a message; ``ascii`` so the message itself always encodes."""
    if len(text) <= QUOTE_LIMIT:
        return ascii(text)
    return f"{ascii(text[:QUOTE_LIMIT])}… ({len(text)} characters)"


def lone_surrogate_at(value: str) -> int | None:
    """Position of the first lone surrogate in ``value``, or None when it encodes as UTF-8."""
    if value.isascii():  # the common case, at memory speed
        return None
    match = _LONE_SURROGATE.search(value)
    return None if match is None else match.start()


def text_problem(value: object) -> str | None:
    """Why ``value`` cannot be stored as text, or None when it can."""
    if type(value) is not str:
        return f"must be a str, got {type(value).__name__}"
    position = lone_surrogate_at(value)
    if position is None:
        return None
    return (
        f"{_quote(value)} holds a lone UTF-16 surrogate \\u{ord(value[position]):04x} at position {position}, "
        "which is not valid Unicode and cannot be written as UTF-8; write the character itself or a full "
        "surrogate pair"
    )


def check_text(value: object, what: str) -> str:
    """``value`` unchanged when it is storable text; else :class:`InvalidTextError` naming ``what``."""
    problem = text_problem(value)
    if problem is not None:
        raise InvalidTextError(f"{what}: {problem}.")
    return value  # type: ignore[return-value]  # text_problem returned None, so value is a str


def escape_lone_surrogates(json_text: str) -> str:
    """JSON text with each lone surrogate (only possible inside a string literal) written as its ``\\uXXXX``
    escape: valid UTF-8 that ``json.loads`` reads back to the same string."""
    return _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", json_text)


def digest_bytes(value: str) -> bytes:
    """UTF-8 bytes of any str, a lone surrogate included (``surrogatepass``): what audit digests hash, so
    the record of a refused value can always be written."""
    return value.encode("utf-8", "surrogatepass")
