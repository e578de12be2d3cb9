"""JSON from an adapter folder (the manifest, a safetensors header) and the gate's own files (the eviction
blocklist, the allow list, ledger lines), parsed only once it is known to be shallow.

The C json parser recurses once per ``[`` or ``{``, so text nested a few hundred thousand levels deep raises
``RecursionError`` mid-parse (and crashes the interpreter where the recursion limit was raised). Both files
are a few levels deep, so the brackets outside strings are paired up first, with regexes that run in linear
time and never recurse, and text nested deeper than the limit is refused before ``json.loads`` sees it.
Duplicate keys are refused too: two ``alpha`` keys would let a file show a reviewer one value and the loader
another.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rvu_pipelines.provenance.canonical import no_duplicate_keys

MAX_DEPTH = 8  # a manifest is 2 levels deep, a safetensors header 3

# A string literal, or the rest of the text after an unterminated quote. Possessive, so a failed match never
# backtracks: the scan stays linear whatever the text (a plain `"(\\.|[^"\\])*"` is quadratic on `"\"\"\"...`).
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+\\?(?:"|\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_INNERMOST_PAIR = re.compile(r"\[\]|\{\}")


def nesting_problem(text: str, max_depth: int = MAX_DEPTH) -> str | None:
    """Why ``text`` cannot be parsed safely (too deep, or brackets that do not pair up), or None.

    Each pass removes the innermost ``[]`` / ``{}`` pairs, so brackets left after ``max_depth`` passes nest
    deeper than that; a pass that removes nothing leaves brackets that are not JSON's."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    for _ in range(max_depth):
        if not brackets:
            return None
        reduced = _INNERMOST_PAIR.sub("", brackets)
        if len(reduced) == len(brackets):
            return "brackets that do not pair up"
        brackets = reduced
    return f"nesting deeper than {max_depth} levels" if brackets else None


def loads_shallow(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` of text nested at most ``max_depth`` levels, without duplicate keys.

    Every problem is a ``ValueError`` (a ``json.JSONDecodeError`` for syntax, a plain one for depth, duplicate
    keys and integers over Python's digit limit), so a caller catches one exception type."""
    problem = nesting_problem(text, max_depth)
    if problem is not None:
        raise ValueError(problem)
    try:
        return json.loads(text, object_pairs_hook=no_duplicate_keys)
    except RecursionError:  # unreachable after the pre-scan; kept so a parser change cannot crash a caller
        raise ValueError(f"nesting deeper than {max_depth} levels") from None


def read_object_of_objects(path: Path, *, what: str, fix: str, max_bytes: int = 16 << 20) -> dict[str, dict[str, Any]]:
    """A JSON file mapping keys to objects (the eviction blocklist, the allow list) read as untrusted input: a
    regular file (never through a link) within ``max_bytes``, shallow, every value an object; else an
    ``InputFileError`` naming the file, the problem and ``fix``. {} when there is no file."""
    from rvu_pipelines.bounded_io import read_input_file, truncate_for_message
    from rvu_pipelines.errors import InputFileError

    if not path.exists() and not path.is_symlink():
        return {}
    data = read_input_file(path, what=what, max_bytes=max_bytes, follow_links=False)
    try:
        parsed = loads_shallow(data.decode("utf-8"))
    except ValueError as exc:  # bad UTF-8, bad JSON, too deep, duplicate keys
        raise InputFileError(
            f"{path}: the {what} is not valid JSON ({truncate_for_message(str(exc), 120)}); {fix}."
        ) from exc
    if not isinstance(parsed, dict):
        raise InputFileError(f"{path}: the {what} must be a JSON object (sha256 -> details); {fix}.")
    for key, value in parsed.items():
        if not isinstance(value, dict):
            shown = truncate_for_message(value, 40)
            raise InputFileError(
                f"{path}: the {what}'s entry {truncate_for_message(key, 70)} is {shown}, not an object; {fix}."
            )
    return parsed
