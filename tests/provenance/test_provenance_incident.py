"""The JSONL incident-log format: examples, every rule, and malformed lines that must ingest nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rvu_pipelines.errors import IncidentValidationError, InputFileError, RvuError
from rvu_pipelines.provenance import load_incident, open_store, parse_incident, write_incident
from rvu_pipelines.provenance.incident import MAX_ISSUES, incident_line, incident_validator, schema_path
from rvu_pipelines.recovery.pipeline import ingest_incident
from rvu_pipelines.recovery.reproductions import e2_records, e3_records, e8_records

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "configs" / "examples"


def lines_of(records: list[dict]) -> list[bytes]:
    return [incident_line(record).encode() for record in records]


def issues_of(data: bytes) -> list:
    with pytest.raises(IncidentValidationError) as caught:
        parse_incident(data, "incident.jsonl")
    return caught.value.issues


def test_schema_is_a_valid_json_schema() -> None:
    assert schema_path().is_file()
    assert incident_validator().schema["$schema"].endswith("2020-12/schema")


def test_example_incident_parses_and_matches_the_e8_scenario() -> None:
    incident = load_incident(EXAMPLES / "incident_example.jsonl")
    assert [r.entry_id for r in incident.records] == [r["entry_id"] for r in e8_records()]
    assert (EXAMPLES / "incident_example.jsonl").read_text() == "".join(incident_line(r) + "\n" for r in e8_records())
    kinds = {r.kind for r in incident.records}
    assert kinds == {"action", "adapter_loaded", "adapter_unloaded", "adapter_fused"}


def test_malformed_example_reports_file_line_and_field_for_each_problem() -> None:
    path = EXAMPLES / "incident_malformed.jsonl"
    with pytest.raises(IncidentValidationError) as caught:
        load_incident(path)
    found = {(issue.line, issue.field) for issue in caught.value.issues}
    assert found == {(2, "content"), (3, "timestamp"), (5, "adapter_hash"), (6, "entry_id"), (7, "<json>")}
    message = str(caught.value)
    assert f"{path}:3: field 'timestamp'" in message and "nothing was ingested" in message
    assert isinstance(caught.value, RvuError)


def test_lifecycle_lines_become_entries_and_load_lines_are_linked_to_their_adapter() -> None:
    incident = parse_incident(b"".join(line + b"\n" for line in lines_of(e2_records())), "e2.jsonl")
    load_b = next(r for r in incident.records if r.entry_id == "load-b")
    assert load_b.action_type == "adapter_load" and load_b.active_adapter_id == "adapter-b"
    assert json.loads(load_b.content)["adapter_name"] == "untrusted-code-lora"
    e8 = parse_incident(b"".join(line + b"\n" for line in lines_of(e8_records())), "e8.jsonl")
    unload = next(r for r in e8.records if r.kind == "adapter_unloaded")
    assert unload.action_type == "adapter_unload" and unload.active_adapter_id is None


@pytest.mark.parametrize(
    ("change", "line", "field"),
    [
        (lambda rs: rs[2].update(parent_id="a3"), 3, "parent_id"),  # parent defined later
        (lambda rs: rs[1].update(parent_id="a1"), 2, "parent_id"),  # own parent
        (lambda rs: rs[2].update(kind="telemetry"), 3, "kind"),
        (lambda rs: rs[2].update(extra="x"), 3, "extra"),
        (lambda rs: rs[2].update(action_type="adapter_load"), 3, "action_type"),
        (lambda rs: rs[2].update(entry_id="has space"), 3, "entry_id"),
        (lambda rs: rs[2].update(timestamp=-1), 3, "timestamp"),
        (lambda rs: rs[2].update(contaminated="yes"), 3, "contaminated"),
        (lambda rs: rs[4].update(influence=1.5), 5, "influence"),
        (lambda rs: rs.insert(3, {**rs[0], "entry_id": "load-a2"}), 4, "adapter_id"),  # loaded twice
    ],
)
def test_each_rule_names_the_line_and_field(change, line: int, field: str) -> None:
    records = e2_records()
    change(records)
    issues = issues_of(b"\n".join(lines_of(records)))
    assert (line, field) in {(issue.line, issue.field) for issue in issues}


def test_adapter_used_after_unload_is_refused() -> None:
    records = e8_records() + [
        {
            "kind": "action",
            "entry_id": "late",
            "episode_id": "ep-e8",
            "timestamp": 1.0,
            "action_type": "tool_output",
            "content": "x",
            "active_adapter_id": "fin-lora",
        }
    ]
    issues = issues_of(b"\n".join(lines_of(records)))
    assert [(i.line, i.field) for i in issues] == [(len(records), "active_adapter_id")]


def test_json_edge_cases_are_refused() -> None:
    assert issues_of(b'{"kind":"action","kind":"action"}')[0].message.startswith("not valid JSON: duplicate key")
    assert issues_of(b'{"kind":"action","timestamp":NaN}')[0].field == "<json>"
    assert issues_of(b"\xc3\x28{}")[0].field == "<line>"
    assert issues_of(b"")[0].field == "<file>"
    assert issues_of(b"[1, 2]")[0].field == "<line>"


def _action(**changes: object) -> bytes:
    record = {**e2_records()[1], "active_adapter_id": None, **changes}
    return incident_line(record).encode()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"kind":"action","timestamp":1e400}', "overflows a 64-bit float"),
        (b'{"kind":"action","timestamp":' + b"9" * 400 + b"}", "outside the 64-bit range"),
        (b'{"kind":"action","timestamp":9223372036854775808}', "outside the 64-bit range"),
        (b'{"kind":"action","x":' + b"[" * 100 + b"]" * 100 + b"}", "nesting deeper than 64"),
        (b"[" * 100_000 + b"]" * 100_000, "nesting deeper than 64"),
        (b'{"kind":"action","content":"\\ud800"}', "lone UTF-16 surrogate"),
        (b'{"kind":"action","\\udfff":1}', "lone UTF-16 surrogate"),
    ],
)
def test_values_later_stages_cannot_hold_are_json_problems(line: bytes, expected: str) -> None:
    issues = issues_of(line)
    assert [issue.field for issue in issues] == ["<json>"]
    assert expected in issues[0].message


def test_overflowing_values_in_an_otherwise_valid_line_are_refused() -> None:
    good = _action()
    for bad in (
        good.replace(b'"timestamp":', b'"timestamp":1e400,"_":'),
        good.replace(b'"content":"', b'"content":"\\ud800'),
    ):
        assert issues_of(good + b"\n" + bad)[0].line == 2


def test_nul_in_content_is_accepted_because_every_later_stage_holds_it() -> None:
    incident = parse_incident(_action(content="a\u0000b"), "nul.jsonl")
    assert incident.records[0].content == "a\x00b"


@pytest.mark.parametrize(
    "data",
    [
        "\n".join(incident_line(r) for r in e2_records()).encode("utf-16"),
        "\n".join(incident_line(r) for r in e2_records()).encode("utf-16-be"),
        b"\xfe\xff",
    ],
)
def test_utf16_file_gets_one_problem_with_a_re_encode_hint(data: bytes) -> None:
    issues = issues_of(data)
    assert len(issues) == 1 and issues[0].field == "<file>"
    assert "UTF-16" in issues[0].message and "iconv" in issues[0].message


def test_each_missing_field_is_attributed_to_itself() -> None:
    record = {key: value for key, value in e2_records()[1].items() if key not in ("content", "timestamp")}
    issues = issues_of(incident_line(record).encode())
    assert sorted(issue.field for issue in issues) == ["content", "timestamp"]
    assert all(f"add '{issue.field}'" in issue.message for issue in issues)


def test_each_extra_field_is_attributed_to_itself() -> None:
    issues = issues_of(_action(zeta=1, alpha=2))
    assert sorted(issue.field for issue in issues) == ["alpha", "zeta"]
    assert all("remove it" in issue.message for issue in issues)


def test_unknown_adapter_on_a_lifecycle_line_names_adapter_id() -> None:
    unload = {"kind": "adapter_unloaded", "entry_id": "un", "episode_id": "e", "timestamp": 1.0, "adapter_id": "zz"}
    incident = parse_incident(_action() + b"\n" + incident_line(unload).encode(), "x")
    assert dict(incident.external_adapters) == {"zz": (2,)}
    assert incident.adapter_field(2) == "adapter_id"
    assert incident.adapter_field(1) == "active_adapter_id"


def test_a_huge_value_is_not_echoed_in_the_message() -> None:
    for line in (
        _action(content="x" * 1_100_000),
        _action(entry_id="y" * 1_000_000),
        _action(**{"z" * 1_000_000: 1}),
        b'{"kind":"action","timestamp":' + b"1" * 1_000_000 + b"}",
        b'{"' + b"k" * 1_000_000 + b'":1,"' + b"k" * 1_000_000 + b'":1}',
    ):
        with pytest.raises(IncidentValidationError) as caught:
            parse_incident(line, "big.jsonl")
        assert len(str(caught.value)) < 10_000
        assert all(len(str(issue)) < 1_000 for issue in caught.value.issues)


def test_problem_count_is_capped_and_not_shown_as_exact() -> None:
    with pytest.raises(IncidentValidationError) as caught:
        parse_incident(b"x\n" * 5000, "many.jsonl")
    assert len(caught.value.issues) == MAX_ISSUES
    message = str(caught.value)
    assert f"first {MAX_ISSUES} of at least {MAX_ISSUES + 1} problems" in message and len(message) < 20_000


def test_missing_device_and_fifo_paths_raise_input_file_error(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    for path in (tmp_path / "absent.jsonl", fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises(InputFileError):
            load_incident(path)


def test_blank_lines_and_crlf_are_accepted() -> None:
    data = b"\r\n\r\n".join(lines_of(e2_records())) + b"\r\n\n"
    assert len(parse_incident(data, "x").records) == len(e2_records())


# --------------------------------------------------------------------------- property: nothing ingested

_REQUIRED = ["kind", "entry_id", "episode_id", "action_type", "content", "timestamp"]
_WRONG = {
    "entry_id": 7,
    "episode_id": None,
    "action_type": "Bad Type",
    "content": 3,
    "timestamp": "now",
    "parent_id": 5,
    "active_adapter_id": ["a"],
    "contaminated": "true",
}


@st.composite
def malformed_incident(draw) -> tuple[bytes, int]:
    """A valid E2 log with one line broken in one of many ways; returns (bytes, broken line number)."""
    records = e2_records()
    actions = [i for i, r in enumerate(records) if r["kind"] == "action"]
    index = draw(st.sampled_from(actions))
    record = dict(records[index])
    mode = draw(
        st.sampled_from(
            [
                "drop",
                "wrong",
                "extra",
                "truncate",
                "bytes",
                "duplicate",
                "unknown_parent",
                "unknown_adapter",
                "not_object",
            ]
        )
    )
    lines = lines_of(records)
    if mode == "drop":
        record.pop(draw(st.sampled_from(_REQUIRED)))
    elif mode == "wrong":
        key = draw(st.sampled_from(sorted(_WRONG)))
        record[key] = _WRONG[key]
    elif mode == "extra":
        record[draw(st.text(alphabet="abcdefghij_", min_size=1, max_size=8).filter(lambda k: k not in record))] = 1
    elif mode == "duplicate":
        record["entry_id"] = records[0]["entry_id"]
    elif mode == "unknown_parent":
        record["parent_id"] = "no-such-entry"
    elif mode == "unknown_adapter":
        record["active_adapter_id"] = "no-such-adapter"
    if mode == "truncate":
        text = lines[index]
        lines[index] = text[: draw(st.integers(min_value=1, max_value=len(text) - 1))]
    elif mode == "bytes":
        lines[index] = lines[index][:10] + b"\xc3\x28" + lines[index][10:]
    elif mode == "not_object":
        lines[index] = draw(st.sampled_from([b"[]", b"42", b'"action"', b"null", b"true"]))
    else:
        lines[index] = incident_line(record).encode()
    return b"\n".join(lines) + b"\n", index + 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=malformed_incident())
def test_malformed_line_gives_clear_error_and_ingests_nothing(case: tuple[bytes, int], tmp_path: Path) -> None:
    data, broken_line = case
    with open_store(":memory:") as store:
        ingest_incident(store, load_incident(write_incident(e3_records(), tmp_path / "e3.jsonl")))
        before = (store.entry_count, store.adapter_count, len(store.events()), store.verify_event_chain().head)
        with pytest.raises(IncidentValidationError) as caught:
            incident = parse_incident(data, "bad.jsonl")
            ingest_incident(store, incident)
        issues = caught.value.issues
        assert issues, "an invalid file must report at least one issue"
        assert broken_line in {issue.line for issue in issues}
        assert all(issue.file == "bad.jsonl" and issue.field and issue.message for issue in issues)
        assert (store.entry_count, store.adapter_count, len(store.events()), store.verify_event_chain().head) == before
