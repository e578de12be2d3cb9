"""Tamper checks for certificates (seed 000 E8): change every leaf field in turn and confirm verification fails.

An auditing tool beside ``certificate.py`` (which signs, writes and verifies): the E8 reproduction and the
tests use it; recovery itself never does.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from rvu_pipelines.recovery.certificate import certificate_bytes, verify_certificate_bytes


def leaf_paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every leaf of a JSON value as a path of keys / list indices (empty objects and lists count as leaves)."""
    if isinstance(value, Mapping) and value:
        return [path for key in sorted(value) for path in leaf_paths(value[key], (*prefix, key))]
    if isinstance(value, list) and value:
        return [path for index, item in enumerate(value) for path in leaf_paths(item, (*prefix, index))]
    return [prefix]


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return round(value + 0.125, 6)
    if isinstance(value, str):
        return value + "x" if value else "x"
    if value is None:
        return "x"
    if isinstance(value, list):
        return ["x"]
    if isinstance(value, Mapping):
        return {"x": 1}
    raise TypeError(type(value).__name__)


def with_leaf_changed(certificate: Mapping[str, Any], path: tuple) -> dict[str, Any]:
    """A deep copy of ``certificate`` with the leaf at ``path`` set to a different value of its type."""
    result = copy.deepcopy(dict(certificate))
    if not path:
        raise ValueError("empty path")
    node: Any = result
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = _changed(node[path[-1]])
    return result


def tamper_report(
    certificate: Mapping[str, Any], *, trusted_fingerprints: Iterable[str] | None = None
) -> dict[str, Any]:
    """Change every leaf field in turn (re-encoded canonically) and check verification fails each time."""
    paths = leaf_paths(certificate)
    undetected = []
    for path in paths:
        ok, _ = verify_certificate_bytes(
            certificate_bytes(with_leaf_changed(certificate, path)), trusted_fingerprints=trusted_fingerprints
        )
        if ok:
            undetected.append("/".join(map(str, path)))
    return {"fields": len(paths), "detected": len(paths) - len(undetected), "undetected": undetected}
