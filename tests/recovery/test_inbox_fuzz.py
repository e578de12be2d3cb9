"""Property: whatever bytes land in the inbox, one triage drains it; each file accepted xor dead-lettered."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rvu_pipelines.errors import IncidentValidationError
from rvu_pipelines.provenance.incident import incident_line, parse_incident
from rvu_pipelines.recovery.inbox import incident_folders, triage_inbox
from rvu_pipelines.recovery.reproductions import e2_records

GOOD_LINES = [incident_line(record).encode() for record in e2_records()]
HOSTILE_TOKENS = [
    b"1e400",
    b"-1e400",
    b"9" * 400,
    b"9223372036854775808",
    b"NaN",
    b'"\\ud800"',
    b'"\\udfff\\ud800"',
    b'"\\u0000"',
    b"[" * 70 + b"]" * 70,
    b"[" * 3000,
    b"\x00",
    b"\xff\xfe",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"{}",
    b"null",
    b"1.5e308",
    b"-0.0",
    b'{"a":[1,{"b":2}]}',
    b'"' + b"x" * 5000 + b'"',
]

HOSTILE_NUMBERS = [b"1e400", b"-1e400", b"9" * 400, b"9223372036854775808", b"1.5e308", b"1e-400", b"-0.0"]


def _with_raw_value(record: dict, key: str, raw: bytes) -> bytes:
    """``record`` as a line whose ``key`` holds the raw JSON text ``raw`` (which may be hostile)."""
    return incident_line({**record, key: "@@RAW@@"}).encode().replace(b'"@@RAW@@"', raw)


@st.composite
def mutated_log(draw: st.DrawFn) -> bytes:
    """A valid E2 log with a few lines changed: a field's value replaced by a hostile JSON token (parses, then
    must be refused), a token spliced in, the line cut or duplicated, or random bytes."""
    records = e2_records()
    lines = list(GOOD_LINES)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        index = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        line = lines[index]
        at = draw(st.integers(min_value=0, max_value=len(line)))
        mode = draw(st.sampled_from(["number", "number", "value", "value", "splice", "cut", "random", "duplicate"]))
        if mode == "number":  # a number that parses but no later stage can hold, where a number belongs
            record = records[min(index, len(records) - 1)]
            key = draw(st.sampled_from(["timestamp", "influence"] if "adapter_hash" in record else ["timestamp"]))
            lines[index] = _with_raw_value(record, key, draw(st.sampled_from(HOSTILE_NUMBERS)))
        elif mode == "value":
            record = records[min(index, len(records) - 1)]
            key = draw(st.sampled_from(sorted(record)))
            lines[index] = _with_raw_value(record, key, draw(st.sampled_from(HOSTILE_TOKENS)))
        elif mode == "splice":
            lines[index] = line[:at] + draw(st.sampled_from(HOSTILE_TOKENS)) + line[at:]
        elif mode == "cut":
            lines[index] = line[:at]
        elif mode == "random":
            lines[index] = draw(st.binary(max_size=200))
        else:
            lines.insert(index, line)
    ending = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    data = ending.join(lines) + ending
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        data = data.decode("utf-8", "replace").encode(draw(st.sampled_from(["utf-16", "utf-16-be", "utf-32"])))
    return data


inbox_file = st.one_of(mutated_log(), mutated_log(), st.binary(max_size=2000), st.just(b"\n".join(GOOD_LINES)))


@settings(max_examples=60, deadline=None)
@given(files=st.lists(inbox_file, min_size=1, max_size=4), linked=st.lists(st.booleans(), min_size=4, max_size=4))
def test_triage_drains_the_inbox_whatever_it_holds(files: list[bytes], linked: list[bool]) -> None:
    """Each file is accepted xor dead-lettered; a link beside it (to a valid log outside the inbox) is always
    dead-lettered as the link itself, and never makes the platform read the file it names."""
    with tempfile.TemporaryDirectory() as tmp:
        folders = incident_folders(Path(tmp) / "incidents")
        outside = Path(tmp) / "outside.jsonl"
        outside.write_bytes(b"\n".join(GOOD_LINES) + b"\n")
        names = []
        for index, data in enumerate(files):
            (folders.inbox / f"{index:02d}.jsonl").write_bytes(data)
            names.append(f"{index:02d}.jsonl")
            if linked[index]:
                (folders.inbox / f"{index:02d}-link.jsonl").symlink_to(outside)
                names.append(f"{index:02d}-link.jsonl")
        outcomes = triage_inbox(folders)
        assert list(folders.inbox.iterdir()) == []
        assert [outcome.source for outcome in outcomes] == sorted(names)
        contents = dict(zip([f"{index:02d}.jsonl" for index in range(len(files))], files, strict=True))
        for outcome in outcomes:
            if outcome.source.endswith("-link.jsonl"):
                assert not outcome.accepted and outcome.dead_letter is not None
                assert Path(outcome.dead_letter).is_symlink() and "symbolic link" in (outcome.error or "")
                continue
            data = contents[outcome.source]
            try:
                parse_incident(data, outcome.source)
                valid = True
            except IncidentValidationError:
                valid = False
            assert outcome.accepted == valid and (outcome.dead_letter is None) == valid
            if outcome.dead_letter is not None:
                report = json.loads(Path(outcome.dead_letter + ".error.json").read_text())
                assert report["error"] == "IncidentValidationError" and report["problems"]
                assert Path(outcome.dead_letter).read_bytes() == data  # dead-lettered as dropped, byte for byte
        assert outside.read_bytes() == b"\n".join(GOOD_LINES) + b"\n"
