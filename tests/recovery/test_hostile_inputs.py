"""Hostile incident logs: every file ends accepted or dead-lettered with a reason, never blocks the inbox.

``hostile_logs/`` holds small hand-made logs, each named for what it tries, and one good log.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from rvu_pipelines.errors import ConfigError, IncidentValidationError, InputFileError, RvuError
from rvu_pipelines.provenance.engines import open_store
from rvu_pipelines.provenance.incident import incident_line, load_incident
from rvu_pipelines.recovery import RecoveryFiles
from rvu_pipelines.recovery.inbox import IncidentFolders, TriageOutcome, incident_folders, triage_inbox
from rvu_pipelines.recovery.pipeline import recover
from rvu_pipelines.recovery.reproductions import e2_records

CORPUS = Path(__file__).with_name("hostile_logs")
HOSTILE = sorted(path for path in CORPUS.iterdir() if path.suffix == ".jsonl")
# the few corpus files that are valid after all: odd but holdable by every later stage
ACCEPTED = {
    "good_e2.jsonl",
    "bidi_override_in_content.jsonl",
    "big_float_precision.jsonl",
    "control_chars_in_content.jsonl",
    "nul_escape_in_content.jsonl",
    "timestamp_huge_exponent_float.jsonl",
    "timestamp_negative_zero.jsonl",
    "timestamp_underflow_to_zero.jsonl",
    "unknown_adapter_unload.jsonl",  # valid on its own; the store refuses the unknown adapter at ingest
    "valid_surrogate_pair_emoji.jsonl",
}


@pytest.fixture
def folders(tmp_path: Path) -> IncidentFolders:
    return incident_folders(tmp_path / "incidents")


def good_log() -> bytes:
    return "".join(incident_line(record) + "\n" for record in e2_records()).encode()


def assert_drained(folders: IncidentFolders, outcomes: list[TriageOutcome]) -> None:
    """The inbox is empty and each outcome is accepted xor dead-lettered (with its report beside it)."""
    assert list(folders.inbox.iterdir()) == []
    for outcome in outcomes:
        assert outcome.accepted != (outcome.dead_letter is not None), outcome
        if outcome.dead_letter is not None:
            report = json.loads(Path(outcome.dead_letter + ".error.json").read_text())
            assert report["file"] == outcome.source and report["error"] and report["message"] and report["problems"]


def dead_letter_report(folders: IncidentFolders, name: str) -> dict:
    return json.loads((folders.dead_letter / f"{name}.error.json").read_text())


def test_corpus_is_small_and_has_a_good_log() -> None:
    assert len(HOSTILE) >= 40 and (CORPUS / "good_e2.jsonl").is_file()
    assert all(path.stat().st_size <= 64 * 1024 for path in HOSTILE)


def test_poison_file_is_dead_lettered_and_the_good_one_after_it_accepted(folders: IncidentFolders) -> None:
    good = good_log()
    (folders.inbox / "a_poison.jsonl").write_bytes(good.replace(b'"timestamp":1718000001.0', b'"timestamp":1e400'))
    (folders.inbox / "b_good.jsonl").write_bytes(good)
    outcomes = triage_inbox(folders)
    assert_drained(folders, outcomes)
    assert [outcome.accepted for outcome in outcomes] == [False, True]
    assert (folders.dead_letter / "a_poison.jsonl").is_file()
    report = dead_letter_report(folders, "a_poison.jsonl")
    assert report["error"] == "IncidentValidationError" and "overflows a 64-bit float" in report["message"]
    assert report["problems"][0]["line"] == 2
    assert folders.accepted_incidents()[0][1] == outcomes[1].sha256


@pytest.mark.parametrize("path", HOSTILE, ids=[path.name for path in HOSTILE])
def test_load_incident_returns_or_raises_only_validation_errors(path: Path) -> None:
    try:
        load_incident(path)
    except (IncidentValidationError, InputFileError) as error:
        assert path.name not in ACCEPTED, error
        assert len(str(error)) < 10_000
    else:
        assert path.name in ACCEPTED


def test_triage_of_the_whole_corpus_at_once_drains_the_inbox(folders: IncidentFolders) -> None:
    for path in HOSTILE:
        shutil.copyfile(path, folders.inbox / path.name)
    outcomes = triage_inbox(folders)
    assert_drained(folders, outcomes)
    assert {outcome.source for outcome in outcomes if outcome.accepted} == ACCEPTED
    for outcome in outcomes:
        if not outcome.accepted:
            assert len(Path(outcome.dead_letter + ".error.json").read_bytes()) < 200_000, outcome.source


@pytest.mark.parametrize("name", sorted(ACCEPTED - {"unknown_adapter_unload.jsonl"}))
def test_accepted_corpus_logs_recover_end_to_end(name: str, tmp_path: Path) -> None:
    """What validation lets through, every later stage (store, embedder, index, certificate) must hold."""
    result = recover(
        CORPUS / name,
        RecoveryFiles(tmp_path / "s.duckdb", tmp_path / "keys", tmp_path / "c.json", index=tmp_path / "i.faiss"),
    )
    assert result.certificate_path.is_file()


def test_utf16_log_is_dead_lettered_with_a_re_encode_hint(folders: IncidentFolders) -> None:
    shutil.copyfile(CORPUS / "utf16_le_with_bom.jsonl", folders.inbox / "u.jsonl")
    assert_drained(folders, triage_inbox(folders))
    [problem] = dead_letter_report(folders, "u.jsonl")["problems"]
    assert problem["field"] == "<file>" and "UTF-8" in problem["message"] and "iconv" in problem["message"]


def test_fifo_device_folder_and_dangling_link_are_dead_lettered_without_being_read(folders: IncidentFolders) -> None:
    os.mkfifo(folders.inbox / "a_fifo.jsonl")  # no writer: a blocking open would hang this test
    (folders.inbox / "b_zero.jsonl").symlink_to("/dev/zero")
    (folders.inbox / "c_folder.jsonl").mkdir()
    (folders.inbox / "d_dangling.jsonl").symlink_to(folders.root / "nowhere")
    (folders.inbox / "e_good.jsonl").write_bytes(good_log())
    outcomes = triage_inbox(folders)
    assert_drained(folders, outcomes)
    assert [outcome.accepted for outcome in outcomes] == [False] * 4 + [True]
    assert "a FIFO" in dead_letter_report(folders, "a_fifo.jsonl")["message"]
    assert "symbolic link" in dead_letter_report(folders, "b_zero.jsonl")["message"]
    assert all(dead_letter_report(folders, o.source)["error"] == "InputFileError" for o in outcomes[:4])
    assert (folders.dead_letter / "b_zero.jsonl").is_symlink()


def test_a_link_to_a_log_elsewhere_is_dead_lettered_without_being_read(folders: IncidentFolders, tmp_path) -> None:
    """A valid log outside the inbox, linked into it: the link itself is moved to dead_letter/ (never followed,
    so the platform reads nothing outside the inbox) and the good file beside it is accepted."""
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(good_log())
    (folders.inbox / "a_link.jsonl").symlink_to(elsewhere)
    (folders.inbox / "b_good.jsonl").write_bytes(good_log().replace(b"ep-e2", b"ep-other"))
    outcomes = triage_inbox(folders)
    assert_drained(folders, outcomes)
    assert [outcome.accepted for outcome in outcomes] == [False, True]
    report = dead_letter_report(folders, "a_link.jsonl")
    assert report["error"] == "InputFileError" and "symbolic link" in report["message"]
    assert str(elsewhere) in report["message"]
    moved = folders.dead_letter / "a_link.jsonl"
    assert moved.is_symlink() and os.readlink(moved) == str(elsewhere)
    assert elsewhere.read_bytes() == good_log() and len(list(folders.accepted.glob("*.jsonl"))) == 1


@pytest.mark.parametrize("name", ["inbox", "accepted", "dead_letter"])
def test_an_incident_folder_that_is_a_link_stops_triage(tmp_path, name: str) -> None:
    """inbox/, accepted/ or dead_letter/ as a link would carry every copy and move outside the root: a clear
    configuration error, and nothing is moved or written."""
    root, outside = tmp_path / "incidents", tmp_path / "outside"
    outside.mkdir()
    folders = incident_folders(root)
    (root / name).rmdir()
    (root / name).symlink_to(outside)
    (folders.inbox / "good.jsonl").write_bytes(good_log())  # through the link when the inbox is the link
    before = sorted(path.name for path in outside.iterdir())
    with pytest.raises(ConfigError, match=f"{name} is a symbolic link") as refused:
        incident_folders(root)
    assert str(outside) in str(refused.value) and "RVU_INCIDENT_DIR" in str(refused.value)
    with pytest.raises(ConfigError, match="nothing was triaged"):
        triage_inbox(folders)
    assert sorted(path.name for path in outside.iterdir()) == before
    assert [path.name for path in folders.inbox.iterdir()] == ["good.jsonl"]


def test_a_file_where_an_incident_folder_belongs_is_a_config_error(tmp_path) -> None:
    root = tmp_path / "incidents"
    root.mkdir()
    (root / "accepted").write_text("")
    with pytest.raises(ConfigError, match="accepted is not a folder"):
        incident_folders(root)
    with pytest.raises(ConfigError, match="Cannot create the incident folder"):
        incident_folders(root / "accepted" / "below-a-file")


def test_oversize_log_is_dead_lettered_with_the_limit(folders: IncidentFolders, monkeypatch) -> None:
    monkeypatch.setenv("RVU_MAX_INPUT_MB", "0.001")
    (folders.inbox / "big.jsonl").write_bytes(good_log() * 2)
    assert_drained(folders, triage_inbox(folders))
    report = dead_letter_report(folders, "big.jsonl")
    assert report["error"] == "InputFileError" and "RVU_MAX_INPUT_MB" in report["message"]


def test_a_bad_read_limit_is_a_config_error_and_moves_nothing(folders: IncidentFolders, monkeypatch) -> None:
    monkeypatch.setenv("RVU_MAX_INPUT_MB", "lots")
    (folders.inbox / "good.jsonl").write_bytes(good_log())
    with pytest.raises(ConfigError):
        triage_inbox(folders)
    assert [path.name for path in folders.inbox.iterdir()] == ["good.jsonl"]


def test_an_unexpected_error_dead_letters_with_its_class_and_the_rest_go_on(folders: IncidentFolders, monkeypatch):
    import rvu_pipelines.recovery.inbox as inbox

    real = inbox.parse_incident

    def flaky(data: bytes, source: str):
        if source.startswith("a_"):
            raise KeyError("x" * 1_000_000)
        return real(data, source)

    monkeypatch.setattr(inbox, "parse_incident", flaky)
    (folders.inbox / "a_boom.jsonl").write_bytes(good_log())
    (folders.inbox / "b_good.jsonl").write_bytes(good_log())
    outcomes = triage_inbox(folders)
    assert_drained(folders, outcomes)
    report = dead_letter_report(folders, "a_boom.jsonl")
    assert report["error"] == "KeyError" and report["message"].startswith("KeyError: ")
    assert len(json.dumps(report)) < 10_000 and outcomes[1].accepted


def test_a_1mb_field_is_truncated_in_the_message_and_the_report(folders: IncidentFolders) -> None:
    record = {**e2_records()[1], "content": "x" * 1_000_001}
    (folders.inbox / "long.jsonl").write_bytes(incident_line(record).encode())
    [outcome] = triage_inbox(folders)
    assert outcome.error is not None and len(outcome.error) < 10_000
    assert len((folders.dead_letter / "long.jsonl.error.json").read_bytes()) < 10_000
    with pytest.raises(IncidentValidationError) as caught:
        load_incident(folders.dead_letter / "long.jsonl")
    assert len(str(caught.value)) < 10_000 and "characters)" in str(caught.value)


def test_many_problems_are_capped_and_said_to_be_at_least(folders: IncidentFolders) -> None:
    (folders.inbox / "many.jsonl").write_bytes(b"x\n" * 10_000)
    [outcome] = triage_inbox(folders)
    report = dead_letter_report(folders, "many.jsonl")
    assert "of at least" in report["message"] and len(report["problems"]) < 10_000
    assert isinstance(outcome.error, str) and len(json.dumps(report)) < 200_000


def test_input_file_error_is_an_rvu_error_so_the_cli_prints_it_without_a_traceback() -> None:
    assert issubclass(InputFileError, RvuError) and issubclass(IncidentValidationError, RvuError)


def test_unknown_adapter_is_named_by_the_field_of_its_line(tmp_path) -> None:
    """An adapter_unloaded line names its adapter in ``adapter_id`` (not ``active_adapter_id``, the
    field of an action line): the store's refusal points at the field the operator has to fix."""
    incident = load_incident(CORPUS / "unknown_adapter_unload.jsonl")
    with open_store(tmp_path / "store.duckdb") as store, pytest.raises(IncidentValidationError) as refused:
        store.ingest(incident, contamination={"u": 0.0}, vectors=np.zeros((1, 4), dtype=np.float32), embedder="t")
    fields = {issue.field for issue in refused.value.issues}
    assert fields == {"adapter_id"}, refused.value.issues
