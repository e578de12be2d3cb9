"""adapter_refused lines: an adapter gate's refusal in the incident log and in the store's chained event log.

A refusal loads nothing, so it must never stand in for a load, never be contaminated and never link an entry
to an adapter; the store logs it once, however often the file is ingested.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest

import rvu_pipelines.recovery.pipeline as pipeline
from rvu_pipelines.adapters.errors import RefusalReason
from rvu_pipelines.errors import IncidentValidationError
from rvu_pipelines.provenance import closure_v1, closure_v2, load_incident, open_store, parse_incident, write_incident
from rvu_pipelines.provenance.canonical import canonical_dumps
from rvu_pipelines.provenance.incident import IncidentLog, incident_line
from rvu_pipelines.recovery import RecoveryFiles

EP = "ep-gate"
HASH_A = "ab" * 32
HASH_ROGUE = "cd" * 32


def _action(entry_id: str, t: float, **fields: Any) -> dict[str, Any]:
    return {
        "kind": "action",
        "entry_id": entry_id,
        "episode_id": EP,
        "timestamp": t,
        "action_type": "tool_output",
        "content": f"text of {entry_id}",
        **fields,
    }


def _refusal(entry_id: str = "refuse-rogue", **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "kind": "adapter_refused",
        "entry_id": entry_id,
        "episode_id": EP,
        "timestamp": 5.0,
        "adapter_id": "rogue",
        "adapter_name": "rogue-lora",
        "adapter_hash": HASH_ROGUE,
        "source": "huggingface",
        "reason": "blocklisted",
        "detail": "sha256 is on the eviction blocklist",
    }
    record.update(fields)
    return {key: value for key, value in record.items() if value is not None}


def gate_records() -> list[dict[str, Any]]:
    """Load A, a contaminated action under A, unload A, then the gate refuses a rogue adapter and a re-load of A;
    an action follows the first refusal (its parent) with no adapter."""
    return [
        _action("u0", 1.0, action_type="user_input"),
        {
            "kind": "adapter_loaded",
            "entry_id": "load-a",
            "episode_id": EP,
            "timestamp": 2.0,
            "adapter_id": "adapter-a",
            "adapter_name": "lora-a",
            "adapter_hash": HASH_A,
        },
        _action("a1", 3.0, parent_id="u0", active_adapter_id="adapter-a", contaminated=True),
        {
            "kind": "adapter_unloaded",
            "entry_id": "unload-a",
            "episode_id": EP,
            "timestamp": 4.0,
            "adapter_id": "adapter-a",
        },
        _refusal(),
        _refusal("refuse-a", adapter_id="adapter-a", adapter_name=None, source=None, reason="sha256_mismatch"),
        _action("c1", 6.0, action_type="assistant_output", parent_id="refuse-rogue"),
    ]


def _parse(records: list[dict[str, Any]]) -> IncidentLog:
    return parse_incident("".join(incident_line(r) + "\n" for r in records).encode(), "incident.jsonl")


def load_written(records: list[dict[str, Any]], path: Path) -> IncidentLog:
    return load_incident(write_incident(records, path))


def _issues(records: list[dict[str, Any]]) -> list[tuple[int, str]]:
    with pytest.raises(IncidentValidationError) as caught:
        _parse(records)
    for issue in caught.value.issues:
        assert f"incident.jsonl:{issue.line}: field '{issue.field}'" in str(caught.value)
    return [(issue.line, issue.field) for issue in caught.value.issues]


# ------------------------------------------------------------------------------------ the log


def test_a_refusal_is_an_entry_that_loads_nothing() -> None:
    incident = _parse(gate_records())
    refusal = next(r for r in incident.records if r.entry_id == "refuse-rogue")
    assert refusal.kind == "adapter_refused" and refusal.action_type == "adapter_refuse"
    assert refusal.active_adapter_id is None and not refusal.contaminated and not refusal.is_action
    assert (refusal.adapter_id, refusal.adapter_hash, refusal.source, refusal.reason) == (
        "rogue",
        HASH_ROGUE,
        "huggingface",
        "blocklisted",
    )
    fields = {key: value for key, value in _refusal().items() if key not in ("entry_id", "episode_id", "timestamp")}
    assert refusal.content == canonical_dumps(fields)
    bare = next(r for r in incident.records if r.entry_id == "refuse-a")
    assert bare.source is None and bare.adapter_name is None and json.loads(bare.content)["reason"] == "sha256_mismatch"
    assert [r.entry_id for r in incident.adapters_refused] == ["refuse-rogue", "refuse-a"]
    assert [r.entry_id for r in incident.adapters_loaded] == ["load-a"]
    # the rogue adapter was never loaded and needs no load; refusing the unloaded A is no use-after-unload
    assert dict(incident.external_adapters) == {}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: r.pop("reason"), "reason"),
        (lambda r: r.update(reason="Blocklisted"), "reason"),
        (lambda r: r.update(reason="blocklisted; rm -rf"), "reason"),
        (lambda r: r.update(reason="r" * 65), "reason"),
        (lambda r: r.update(adapter_hash="AB" * 32), "adapter_hash"),
        (lambda r: r.update(adapter_hash="ab" * 31), "adapter_hash"),
        (lambda r: r.update(detail="x" * 2001), "detail"),
        (lambda r: r.update(contaminated=True), "contaminated"),
        (lambda r: r.update(influence=0.5), "influence"),
        (lambda r: r.pop("adapter_id"), "adapter_id"),
    ],
)
def test_a_bad_refusal_line_names_its_line_and_field(change, field: str) -> None:
    records = gate_records()
    change(records[4])
    assert _issues(records) == [(5, field)]


def test_an_action_line_may_not_pose_as_a_refusal() -> None:
    records = [*gate_records(), _action("fake", 7.0, action_type="adapter_refuse")]
    assert _issues(records) == [(len(records), "action_type")]


def test_a_refused_adapter_is_not_loaded_for_later_lines(tmp_path: Path) -> None:
    records = [*gate_records(), _action("under-rogue", 7.0, active_adapter_id="rogue")]
    incident = _parse(records)
    assert dict(incident.external_adapters) == {"rogue": (len(records),)}  # left for the store, which lacks it
    with open_store(tmp_path / "store.duckdb") as store:
        with pytest.raises(IncidentValidationError) as caught:
            store.ingest(incident)
        [issue] = caught.value.issues
        assert (issue.line, issue.field) == (len(records), "active_adapter_id")
        assert "neither loaded on an earlier line nor in the store" in issue.message and "line 5" in issue.message
        assert store.entry_count == 0 and store.events() == []


# ------------------------------------------------------------------------------------ the store


def test_ingest_logs_each_refusal_once_and_creates_no_adapter(tmp_path: Path, store_location: str) -> None:
    incident = load_written(gate_records(), tmp_path / "gate.jsonl")
    with open_store(store_location) as store:
        store.ingest(incident)
        assert store.adapter_count == 1 and store.adapters()[0].adapter_id == "adapter-a"
        refusal = store.entry("refuse-rogue")
        assert refusal.action_type == "adapter_refuse" and refusal.active_adapter_id is None
        assert store.graph().adapter[refusal.seq] == -1
        refused = store.events("adapter_refused")
        assert [(e.subject_type, e.subjects) for e in refused] == [("adapter", []), ("adapter", [])]
        assert refused[0].details == {
            "incident_id": incident.incident_id,
            "entry_id": "refuse-rogue",
            "adapter_id": "rogue",
            "adapter_hash": HASH_ROGUE,
            "source": "huggingface",
            "reason": "blocklisted",
        }
        assert refused[1].details["adapter_id"] == "adapter-a" and refused[1].details["source"] is None
        count = len(store.events())
        store.ingest(incident)
        again = load_written([*gate_records()[4:5], _action("later", 8.0)], tmp_path / "again.jsonl")
        store.ingest(again)  # the same refusal line in another file is not a new refusal
        assert [e.kind for e in store.events()[count:]] == ["ingested"]
        assert len(store.events("adapter_refused")) == 2
        assert store.verify_event_chain().ok


def test_closure_does_not_reach_through_a_refusal(tmp_path: Path, store_location: str) -> None:
    incident = load_written(gate_records(), tmp_path / "gate.jsonl")
    with open_store(store_location) as store:
        store.ingest(incident)
        graph = store.graph()
        seed = store.seqs_of(["a1"])
        for closure in (closure_v1(graph, seed), closure_v2(graph, seed)):
            reached = set(store.entry_ids(closure.members))
            assert not reached & {"refuse-rogue", "refuse-a", "c1", "unload-a"}
        assert set(store.entry_ids(closure_v2(graph, seed).members)) == {"u0", "load-a", "a1"}
        assert store.adapter_ids(closure_v2(graph, seed).tainted_adapters) == ["adapter-a"]


def test_recovery_runs_over_a_log_with_refusals(tmp_path: Path) -> None:
    path = write_incident(gate_records(), tmp_path / "gate.jsonl")
    result = pipeline.recover(
        path, RecoveryFiles(tmp_path / "s.duckdb", tmp_path / "k", tmp_path / "c.json", index=tmp_path / "s.faiss")
    )
    assert result.seeds == ["a1"]
    assert not set(result.closure_v2) & {"refuse-rogue", "refuse-a", "c1"}
    assert set(result.closure_v2) == {"u0", "load-a", "a1"}


def test_gate_verdicts_outside_an_incident_join_the_chain(tmp_path: Path, store_location: str) -> None:
    with open_store(store_location) as store:
        store.ingest(load_written(gate_records(), tmp_path / "gate.jsonl"))
        before = len(store.events())
        admitted = {"adapter_id": "fresh", "adapter_hash": HASH_A, "gate": "screening"}
        refused = {"adapter_id": "rogue", "adapter_hash": HASH_ROGUE, "reason": "gate_ood", "score": 0.93}
        store.record_gate_verdict("admitted", admitted)
        store.record_gate_verdict("refused", refused)
        new = store.events()[before:]
        assert [(e.kind, e.subject_type, e.subjects, e.details) for e in new] == [
            ("adapter_admitted", "adapter", [], admitted),
            ("adapter_refused", "adapter", [], refused),
        ]
        with pytest.raises(ValueError, match="admitted' or 'refused"):
            store.record_gate_verdict("maybe", {})  # type: ignore[arg-type]
        assert len(store.events()) == before + 2
        report = store.verify_event_chain()
        assert report.ok and report.events == before + 2 and report.head == new[-1].hash


def test_the_reason_codes_an_adapter_gate_raises_fit_the_schema() -> None:
    reasons = [*get_args(RefusalReason), "not_screened"]
    records = [_refusal(f"r-{i}", reason=reason) for i, reason in enumerate(reasons)]
    assert [r.reason for r in _parse(records).adapters_refused] == reasons
