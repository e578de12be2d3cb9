"""The gate's own files (the eviction blocklist, the allow list, the ledger) are read as untrusted input: a
broken or planted one is an error that names the file and the fix, never a traceback, and a gate that cannot
read its blocklist loads nothing (it fails closed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rvu_pipelines.adapters.admission import GateLedger, read_allow_entries
from rvu_pipelines.adapters.blocklist import read_blocklist
from rvu_pipelines.errors import InputFileError

DEEP = "[" * 100_000 + "]" * 100_000
SHA = "ab" * 32

CASES = {
    "an entry that is a number": (json.dumps({SHA: 5}), "is 5, not an object"),
    "an entry that is text": (json.dumps({SHA: "evicted"}), "is 'evicted', not an object"),
    "a list": ("[1, 2]", "must be a JSON object"),
    "not JSON": ("evicted: yes", "not valid JSON"),
    "nested 100,000 deep": (DEEP, "nesting deeper than"),
    "a duplicate key": (f'{{"{SHA}": {{}}, "{SHA}": {{}}}}', "not valid JSON"),
    "not UTF-8": (b"\xff\xfe{}", "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("reader", [read_blocklist, read_allow_entries], ids=["blocklist", "allow list"])
def test_a_broken_list_is_an_error_naming_the_file(case: str, reader, tmp_path: Path) -> None:
    text, fragment = CASES[case]
    path = tmp_path / "list.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InputFileError) as caught:
        reader(path)
    assert str(path) in str(caught.value) and fragment in str(caught.value), str(caught.value)


@pytest.mark.parametrize("reader", [read_blocklist, read_allow_entries], ids=["blocklist", "allow list"])
def test_a_list_is_read_whole_or_not_at_all_and_never_through_a_link(reader, tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    assert reader(path) == {}
    path.write_text(json.dumps({SHA: {"adapter_id": "a", "incident": "inc-1"}}))
    assert reader(path) == {SHA: {"adapter_id": "a", "incident": "inc-1"}}
    linked = tmp_path / "linked.json"
    linked.symlink_to(path)
    with pytest.raises(InputFileError, match="link"):
        reader(linked)
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(InputFileError, match="regular file"):
        reader(tmp_path / "folder.json")


def test_ledger_lines_that_are_cut_planted_or_nested_deep_are_skipped(tmp_path: Path) -> None:
    ledger = GateLedger(tmp_path / "gate_ledger.jsonl")
    ledger.append({"event": "admitted", "gguf_sha256": SHA, "decision": "admit"})
    with ledger.path.open("ab") as handle:
        handle.write(b"\x00\xff not json\n[1, 2]\n" + DEEP.encode() + b'\n{"event": "admitted", "gguf_sha')
    assert [row["_line"] for row in ledger.records()] == [1]
    assert ledger.admission_of(SHA) is not None


def test_a_recovery_with_an_unreadable_blocklist_stops_naming_it(tmp_path: Path, monkeypatch) -> None:
    """Unlike a bad screening table (the behavioural layers are then "not screened"), a blocklist that cannot be
    read leaves the certificate's list verdicts unknowable: the recovery stops and says which file to restore."""
    from rvu_pipelines.adapters.recovery_gate import default_gate

    monkeypatch.setenv("RVU_HOME", str(tmp_path))
    (tmp_path / "adapters").mkdir()
    (tmp_path / "adapters" / "blocklist.json").write_text("[" * 100_000)
    with pytest.raises(InputFileError, match="blocklist.json: the adapter eviction blocklist"):
        default_gate()


def test_allow_with_an_unreadable_allow_list_is_an_error_not_a_traceback(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from rvu_pipelines.cli import cli

    monkeypatch.setenv("RVU_HOME", str(tmp_path))
    (tmp_path / "adapter_gate").mkdir()
    (tmp_path / "adapter_gate" / "allow.json").write_text("{{{")
    result = CliRunner().invoke(cli, ["adapters", "allow", SHA, "--by", "ops", "--reason", "reviewed"])
    assert result.exit_code == 2 and "allow list is not valid JSON" in " ".join(result.output.split())
    assert result.exception is None or isinstance(result.exception, SystemExit)


def _gate_yaml(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "adapters.yaml"
    path.write_text("gate:\n" + body)
    return path


@pytest.mark.parametrize("written", [SHA.upper(), f"  {SHA} ", SHA[:32].upper() + SHA[32:]])
def test_a_blocked_sha256_in_either_case_blocks_its_adapter(written: str, tmp_path: Path) -> None:
    """Tools print a sha256 in upper or lower case; the gate compares lower case, so an entry written the other way
    must still block its adapter rather than silently match nothing."""
    from rvu_pipelines.adapters.gate import list_verdict, load_gate_config

    config = load_gate_config(_gate_yaml(tmp_path, f"  blocked_sha256: ['{written}']\n"))
    assert config.blocked_sha256 == [SHA]
    assert list_verdict(SHA, "rvu-zoo", config, {}) == "blocklisted"
    assert list_verdict("cd" * 32, "rvu-zoo", config, {}) == "pass"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("  blocked_sha256: ['abc']\n", "is not a sha256"),
        ("  blocked_sha256: ['" + "g" * 64 + "']\n", "is not a sha256"),
        ("  blocked_sha256: [12345]\n", "valid string"),
        ("  allowed_sources: ['']\n", "matches every source"),
        ("  blocked_sources: ['rvu-zoo', '  ']\n", "entry 1 is blank"),
        ("  reference_adapter: ''\n", "reference_adapter"),
    ],
)
def test_a_gate_list_entry_that_can_match_nothing_or_everything_is_refused(
    body: str, fragment: str, tmp_path: Path
) -> None:
    from rvu_pipelines.adapters.gate import load_gate_config
    from rvu_pipelines.errors import ConfigError

    path = _gate_yaml(tmp_path, body)
    with pytest.raises(ConfigError) as caught:
        load_gate_config(path)
    assert str(path) in str(caught.value) and fragment in str(caught.value), str(caught.value)


def test_allow_takes_a_sha256_in_upper_case_and_records_it_as_the_gate_compares_it(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from rvu_pipelines.cli import cli

    monkeypatch.setenv("RVU_HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["adapters", "allow", SHA.upper(), "--by", "ops", "--reason", "reviewed"])
    assert result.exit_code == 0, result.output
    assert list(read_allow_entries(tmp_path / "adapter_gate" / "allow.json")) == [SHA]
    [line] = (tmp_path / "adapter_gate" / "gate_ledger.jsonl").read_text().splitlines()
    assert json.loads(line)["sha256"] == SHA
    refused = CliRunner().invoke(cli, ["adapters", "allow", "xyz", "--by", "ops", "--reason", "reviewed"])
    assert refused.exit_code == 2 and "is not a sha256" in refused.output
