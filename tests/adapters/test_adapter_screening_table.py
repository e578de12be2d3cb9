"""The screening table sets every threshold the load gate judges by, so a broken or planted one is an error that
names the file, the column and the line: never a crash, and never NaN / inf scores that make every comparison
pass. A recovery whose table is broken still goes on and says why its behavioural layers were not screened."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from rvu_pipelines.adapters.admission import BEHAVIOURAL_LAYERS, BenignReference, read_screening_table
from rvu_pipelines.adapters.gate import GateConfig
from rvu_pipelines.cli import cli
from rvu_pipelines.errors import InputFileError
from rvu_pipelines.paths import project_root

COLUMNS = ["adapter_id", "label", "category", "sha256", *BEHAVIOURAL_LAYERS, "behaviour_texts"]


def _row(i: int, label: str = "benign", **cells: str) -> list[str]:
    scores = {layer: f"{0.01 * (i + 1) * (k + 1):.3f}" for k, layer in enumerate(BEHAVIOURAL_LAYERS)}
    values = {"adapter_id": f"a-{i}", "label": label, "category": "task", "sha256": f"{i:064x}", **scores}
    return [{**values, "behaviour_texts": "32", **cells}.get(column, "") for column in COLUMNS]


def _table(path: Path, rows: list[list[str]], columns: list[str] = COLUMNS) -> Path:
    path.write_text("\n".join(",".join(row) for row in [columns, *rows]) + "\n")
    return path


def test_a_valid_table_reads_as_floats_with_empty_cells_as_unscored(tmp_path: Path) -> None:
    rows = [_row(i) for i in range(4)] + [_row(4, "harmful", hazard="")]
    table = read_screening_table(_table(tmp_path / "scores.csv", rows))
    assert [r["adapter_id"] for r in table] == [f"a-{i}" for i in range(5)]
    assert table[4]["hazard"] is None and isinstance(table[0]["ood"], float)
    assert table[0]["sha256"] == "0" * 64  # an all-digit sha256 stays text
    reference = BenignReference.from_rows(table, GateConfig())
    assert set(reference.thresholds) == set(BEHAVIOURAL_LAYERS)
    assert read_screening_table(tmp_path / "absent.csv") == []


CASES = {
    "a score that is text": ([_row(0), _row(1, ood="abc")], COLUMNS, "column 'ood', line 3 (adapter 'a-1'): 'abc'"),
    "an infinite score": ([_row(0, behaviour="inf"), _row(1)], COLUMNS, "column 'behaviour', line 2"),
    "a NaN score": ([_row(0), _row(1, qa_drop="NaN")], COLUMNS, "column 'qa_drop', line 3"),
    "a NaN step": ([_row(0, behaviour_texts="NaN")], COLUMNS, "column 'behaviour_texts', line 2"),
    "an unknown label": ([_row(0, label="trusted")], COLUMNS, "column 'label' holds ['trusted']"),
    "no label column": ([["a-0", "0" * 64]], ["adapter_id", "sha256"], "column(s) label missing"),
    "no columns it needs": ([["1", "2"]], ["x", "y"], "column(s) sha256, label missing"),
    "a ragged line": ([[*_row(0), "extra", "extra"]], COLUMNS, "not a readable screening table"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_table_is_an_error_naming_file_column_and_line(case: str, tmp_path: Path) -> None:
    rows, columns, fragment = CASES[case]
    path = _table(tmp_path / "scores.csv", rows, columns)
    with pytest.raises(InputFileError) as caught:
        read_screening_table(path)
    assert str(path) in str(caught.value) and fragment in str(caught.value), str(caught.value)


@pytest.mark.parametrize("data", [b"", b"\x00\x01PK\x03\x04" * 40], ids=["empty", "binary"])
def test_a_file_that_is_no_table_at_all_is_an_error(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "scores.csv"
    path.write_bytes(data)
    with pytest.raises(InputFileError, match="screening table"):
        read_screening_table(path)


def test_a_recovery_with_a_broken_table_goes_on_and_the_cli_names_the_column(tmp_path, monkeypatch) -> None:
    from rvu_pipelines.adapters.recovery_gate import default_gate
    from rvu_pipelines.adapters.runtime import lifecycle_fields
    from rvu_pipelines.provenance import load_incident

    home = tmp_path / "home"
    config_dir = tmp_path / "configs"
    shutil.copytree(project_root() / "configs", config_dir)
    monkeypatch.setenv("RVU_HOME", str(home))
    monkeypatch.setenv("RVU_CONFIG_DIR", str(config_dir))
    (home / "adapter_study").mkdir(parents=True)
    _table(home / "adapter_study" / "scores.csv", [_row(0), _row(1, ood="inf")])
    line = {**lifecycle_fields("adapter_loaded", "a", sha256="d" * 64), "entry_id": "s/e0", "episode_id": "s"}
    path = tmp_path / "incident.jsonl"
    path.write_text(json.dumps({**line, "timestamp": 1.0}) + "\n")
    [record] = load_incident(path).adapters_loaded
    screened = default_gate().screen(record)
    assert screened["verdict"] == "unknown" and "screening table is unreadable" in screened["behaviour_reason"]
    assert str(tmp_path) not in json.dumps(screened)
    shown = CliRunner().invoke(cli, ["adapters", "draw", "show"])
    assert shown.exit_code == 2 and "column 'ood', line 3" in " ".join(shown.output.split())  # wrapped or not
