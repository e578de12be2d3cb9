"""Canonical JSON: exactly one byte string per value.

Digests, signatures and the event hash chain are computed over these bytes, so two runs that hold
the same data produce the same bytes: keys sorted, no whitespace, ASCII only, and every float written
with a fixed six decimals (``0.550000``) instead of Python's shortest repr, which differs for values
that print alike. Integers stay integers; NaN and infinities are refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

FLOAT_DECIMALS = 6


def format_float(value: float) -> str:
    """A float as the canonical form writes it: fixed decimals, no negative zero."""
    if not math.isfinite(value):
        raise ValueError(f"canonical JSON cannot hold {value!r}")
    text = f"{value:.{FLOAT_DECIMALS}f}"
    if text.startswith("-") and float(text) == 0.0:
        text = text[1:]
    return text


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(format_float(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=True))
    elif isinstance(value, Mapping):
        out.append("{")
        for index, key in enumerate(sorted(value)):
            if not isinstance(key, str):
                raise TypeError(f"canonical JSON keys must be strings, got {key!r}")
            if index:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=True))
            out.append(":")
            _encode(value[key], out)
        out.append("}")
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        # numpy scalars and the like: convert explicitly so the type is never guessed silently
        if hasattr(value, "item"):
            _encode(value.item(), out)
            return
        raise TypeError(f"canonical JSON cannot encode {type(value).__name__}")


def canonical_dumps(value: Any) -> str:
    """The canonical text of ``value`` (see the module docstring for the rules)."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def canonical_bytes(value: Any) -> bytes:
    return canonical_dumps(value).encode("ascii")


def strict_loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses duplicate keys and NaN/Infinity, which canonical JSON never holds."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, item in pairs:
            if key in result:
                raise ValueError(f"duplicate key {key!r}")
            result[key] = item
        return result

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
