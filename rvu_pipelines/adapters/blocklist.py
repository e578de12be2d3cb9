"""The adapters RVU evicted, by sha256: layer 1 of every later gate refuses them.

``record_evictions`` appends the sha256 of every adapter a recovery evicted (read from the incident's
``adapter_loaded`` lines) to ``<RVU_HOME>/adapters/blocklist.json``; ``gate.check_lists`` and the
recovery-side ``ScreeningGate`` read it beside ``configs/adapters.yaml``'s static lists, so the same file
uploaded again under another name or id is refused before it loads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.paths import state_dir
from rvu_pipelines.provenance.incident import IncidentLog

BLOCKLIST_RELATIVE = Path("adapters") / "blocklist.json"  # under <RVU_HOME>


def blocklist_path() -> Path:
    return state_dir() / BLOCKLIST_RELATIVE


def read_blocklist(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """sha256 -> why it was blocked (adapter id, incident); {} when no file exists. A file that cannot be read
    is an ``InputFileError``: a gate that cannot read it judges nothing (it fails closed)."""
    from rvu_pipelines.adapters.shallow_json import read_object_of_objects

    return read_object_of_objects(
        path or blocklist_path(),
        what="adapter eviction blocklist",
        fix="restore it from a backup or the recoveries' certificates (each names the adapters it evicted)",
    )


def record_evictions(incident: IncidentLog, evicted_adapter_ids: Iterable[str], path: Path | None = None) -> list[str]:
    """Add the evicted adapters' sha256 (from the incident's load lines) to the blocklist; returns those added."""
    path = path or blocklist_path()
    hashes = {r.adapter_id: r.adapter_hash for r in incident.adapters_loaded if r.adapter_hash}
    current = read_blocklist(path)
    added = []
    for adapter_id in sorted(set(evicted_adapter_ids)):
        sha = hashes.get(adapter_id)
        if sha and sha not in current:
            current[sha] = {"adapter_id": adapter_id, "incident": incident.incident_id}
            added.append(sha)
    if added:
        write_atomically(path, json.dumps(current, indent=1, sort_keys=True))  # a reader never sees half a file
    return added
