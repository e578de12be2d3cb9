"""Canonical JSON: exactly one byte string per value.

Digests, signatures and the event hash chain are computed over these bytes, so two runs that hold
the same data produce the same bytes: keys sorted, no whitespace, ASCII only, and every float written
with a fixed six decimals (``0.550000``) instead of Python's shortest repr, which differs for values
that print alike. Integers stay integers; NaN and infinities are refused.

Values read from outside (:func:`strict_loads`) are also refused when a later stage could not hold
them: numbers that overflow a 64-bit float, integers outside DuckDB's BIGINT range, nesting deeper
than :data:`MAX_DEPTH`, and lone UTF-16 surrogates (``"\\ud800"``), which no UTF-8 encoder accepts
(:mod:`rvu_pipelines.text_rules`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from rvu_pipelines.text_rules import lone_surrogate_at

FLOAT_DECIMALS = 6
MAX_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_QUOTE_LIMIT = 60


def _quote(text: str) -> str:
    """A piece of input for an error message, cut short so a hostile value is never echoed in full."""
    return repr(text) if len(text) <= _QUOTE_LIMIT else f"{text[:_QUOTE_LIMIT]!r}… ({len(text)} characters)"


def _check_string(value: str) -> None:
    position = lone_surrogate_at(value)
    if position is not None:
        raise ValueError(
            f"string {_quote(value)} holds a lone UTF-16 surrogate \\u{ord(value[position]):04x} at position "
            f"{position}, which is not valid Unicode; write the character itself or a full surrogate pair"
        )


def format_float(value: float) -> str:
    """A float as the canonical form writes it: fixed decimals, no negative zero."""
    if not math.isfinite(value):
        raise ValueError(f"canonical JSON cannot hold {value!r}")
    text = f"{value:.{FLOAT_DECIMALS}f}"
    if text.startswith("-") and float(text) == 0.0:
        text = text[1:]
    return text


def _encode(value: Any, out: list[str], depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"canonical JSON refuses nesting deeper than {MAX_DEPTH} levels")
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
        _check_string(value)
        out.append(json.dumps(value, ensure_ascii=True))
    elif isinstance(value, Mapping):
        out.append("{")
        for index, key in enumerate(sorted(value)):
            if not isinstance(key, str):
                raise TypeError(f"canonical JSON keys must be strings, got {key!r}")
            if index:
                out.append(",")
            _check_string(key)
            out.append(json.dumps(key, ensure_ascii=True))
            out.append(":")
            _encode(value[key], out, depth + 1)
        out.append("}")
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out, depth + 1)
        out.append("]")
    else:
        # numpy scalars and the like: convert explicitly so the type is never guessed silently
        if hasattr(value, "item"):
            _encode(value.item(), out, depth)
            return
        raise TypeError(f"canonical JSON cannot encode {type(value).__name__}")


def canonical_dumps(value: Any) -> str:
    """The canonical text of ``value`` (see the module docstring for the rules)."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def canonical_bytes(value: Any) -> bytes:
    return canonical_dumps(value).encode("ascii")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {_quote(text)} overflows a 64-bit float; its magnitude must stay below 1.8e308")
    return value


def _int64(text: str) -> int:
    if len(text) > 20:  # refuse before int() does quadratic work on thousands of digits
        raise ValueError(f"integer {_quote(text)} has {len(text)} digits, outside the 64-bit range")
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"integer {_quote(text)} is outside the 64-bit range [-2**63, 2**63 - 1]")
    return value


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook`` that refuses a repeated key: two values for one key would let a
    reader see one and a loader the other."""
    result: dict[str, Any] = {}
    for key, item in pairs:
        if key in result:
            raise ValueError(f"duplicate key {_quote(key)}")
        result[key] = item
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def check_value(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Refuse a decoded value a later stage cannot hold: too deep, or a string that is not valid Unicode.

    Walks with an explicit stack, so a hostile depth cannot exhaust the interpreter's recursion limit.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_string(item)
        elif isinstance(item, (dict, list)):
            if depth >= max_depth:
                raise ValueError(f"nesting deeper than {max_depth} levels; flatten the value")
            if isinstance(item, dict):
                for key in item:
                    _check_string(key)
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)


def strict_loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses what canonical JSON cannot hold (duplicate keys, NaN/Infinity,
    overflowing numbers, deep nesting, lone surrogates), so it fails here with a ValueError and not later."""
    try:
        value = json.loads(
            text,
            object_pairs_hook=no_duplicate_keys,
            parse_constant=_no_constant,
            parse_float=_finite_float,
            parse_int=_int64,
        )
    except RecursionError:
        raise ValueError(f"nesting deeper than {MAX_DEPTH} levels; flatten the value") from None
    check_value(value)
    return value
