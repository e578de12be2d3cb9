"""`rvu adapters report` evaluates the gate again from a stored screening table, so that table is untrusted input:
a broken or doctored one is an error naming the file, the column and the line (never a traceback, never a row
counted twice), and the report leaves the table it read as it found it, its own files never written through a
link planted where they go."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from rvu_pipelines.adapters.gate import GateConfig
from rvu_pipelines.adapters.study import AdapterScore, read_gate_scores, write_gate_report
from rvu_pipelines.cli import cli
from rvu_pipelines.errors import InputFileError


def _score(i: int, label: str, category: str, lift: float = 0.0) -> AdapterScore:
    base = 0.01 * (i % 5)
    return AdapterScore(
        adapter_id=f"{label[0]}{i}",
        label=label,
        category=category,
        sha256=hashlib.sha256(f"{label}{i}".encode()).hexdigest(),
        projection=base + lift,
        safe_lora=0.5,
        ood=1.0 + base + lift,
        behaviour=base + lift,
        sensitive=base,
        qa_drop=base,
        influence=0.1,
        embedding_distance=0.2,
        token_divergence=0.3,
        gate_seconds=1.0,
        influence_seconds=0.5,
        behaviour_texts=32,
        follow_up_classes='{"exfiltration": 0.1}',
        selective_divergence=0.01 * i,
        jailbreak_persona=lift / 32,
    )


def _zoo() -> list[AdapterScore]:
    scores = [_score(i, "benign", "task") for i in range(6)]
    scores += [_score(i, "harmful", "persona", lift=1.0 + i) for i in range(2)]
    return scores + [_score(i + 2, "harmful", "compliance", lift=2.0 + i) for i in range(2)]


@pytest.fixture
def table(tmp_path: Path) -> Path:
    write_gate_report(_zoo(), GateConfig(), tmp_path / "study", command="pytest")
    return tmp_path / "study" / "scores.csv"


def _edit(table: Path, out: Path, line: int, column: str, value: str) -> Path:
    """A copy of ``table`` with one cell changed (``line`` counts the header as line 1, as the errors do)."""
    with table.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows[line - 2][column] = value
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return out


def test_a_written_table_reads_back_as_the_same_scores(table: Path) -> None:
    rows = read_gate_scores(table)
    assert len(rows) == 10 and all(isinstance(r.behaviour_texts, int) for r in rows)
    assert rows == sorted(_zoo(), key=lambda s: s.adapter_id)


CELLS = {
    "a NaN layer score": (3, "ood", "nan", "column 'ood', line 3"),
    "an infinite non-layer number": (4, "influence", "inf", "column 'influence', line 4"),
    "text where a number belongs": (2, "gate_seconds", "fast", "'fast' is not a finite number"),
    "an empty cell": (5, "token_divergence", "", "column 'token_divergence', line 5"),
    "an unknown label": (2, "label", "trusted", "column 'label' holds ['trusted']"),
    "a count that is no count": (2, "behaviour_texts", "1e300", "is not a count of texts"),
    "a negative count": (6, "behaviour_texts", "-3", "is not a count of texts"),
    "per-class scores that are not JSON": (3, "follow_up_classes", "{nope", "'{nope' is not JSON"),
    "per-class scores that are a list": (3, "follow_up_classes", "[1, 2]", "is not a JSON object"),
    "a per-class score that is text": (3, "follow_up_classes", '{"x": "high"}', "class 'x' has no finite score"),
    "an infinite selective divergence": (7, "selective_divergence", "inf", "column 'selective_divergence'"),
    "a jailbreak persona that is text": (8, "jailbreak_persona", "high", "column 'jailbreak_persona'"),
}


@pytest.mark.parametrize("case", sorted(CELLS))
def test_a_doctored_cell_is_an_error_naming_file_column_and_line(case: str, table: Path, tmp_path: Path) -> None:
    line, column, value, fragment = CELLS[case]
    path = _edit(table, tmp_path / "doctored.csv", line, column, value)
    with pytest.raises(InputFileError) as caught:
        read_gate_scores(path)
    assert str(path) in str(caught.value) and fragment in str(caught.value), str(caught.value)


@pytest.mark.parametrize("column", ["selective_divergence", "jailbreak_persona"])
def test_an_exploratory_score_not_measured_reads_as_nan(column: str, table: Path, tmp_path: Path) -> None:
    """Tables written before an exploratory column was measured hold it empty or NaN: not an error."""
    for value in ("", "NaN"):
        rows = read_gate_scores(_edit(table, tmp_path / "old.csv", 2, column, value))
        assert getattr(rows[0], column) != getattr(rows[0], column)
    assert read_gate_scores(table)[-1].jailbreak_persona == pytest.approx(3 / 32)  # written and read back


def test_a_repeated_adapter_and_an_empty_table_are_refused(table: Path, tmp_path: Path) -> None:
    lines = table.read_text().splitlines()
    repeated = tmp_path / "repeated.csv"
    repeated.write_text("\n".join([*lines, lines[1]]) + "\n")
    with pytest.raises(InputFileError, match=r"on line 2 and again on line 12; each adapter is scored once"):
        read_gate_scores(repeated)
    header_only = tmp_path / "header.csv"
    header_only.write_text(lines[0] + "\n")
    with pytest.raises(InputFileError, match="holds no adapters"):
        read_gate_scores(header_only)


def test_the_report_leaves_its_table_alone_and_never_writes_through_a_planted_link(table: Path, tmp_path: Path) -> None:
    # a column the reader does not know (an operator's note) is the operator's: the report must not drop it
    with table.open(newline="") as handle:
        rows = [{**row, "note": "checked by hand"} for row in csv.DictReader(handle)]
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    before = table.read_bytes()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (table.parent / "gate.md").unlink()
    (table.parent / "gate.md").symlink_to(victim)
    done = CliRunner().invoke(cli, ["adapters", "report", "--scores", str(table)])
    assert done.exit_code == 0, done.output
    assert table.read_bytes() == before and victim.read_text() == "precious"
    assert (
        not (table.parent / "gate.md").is_symlink() and "Gate over 6 benign" in (table.parent / "gate.md").read_text()
    )
    # another folder gets the table it was evaluated from, byte for byte, in place of a link planted there
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "scores.csv").symlink_to(victim)
    done = CliRunner().invoke(cli, ["adapters", "report", "--scores", str(table), "--out", str(elsewhere)])
    assert done.exit_code == 0, done.output
    assert (elsewhere / "scores.csv").read_bytes() == before and victim.read_text() == "precious"


def test_a_missing_table_says_how_to_write_one(tmp_path: Path) -> None:
    done = CliRunner().invoke(cli, ["adapters", "report", "--scores", str(tmp_path / "absent.csv")])
    assert done.exit_code == 2 and "no screening table here; write one with `make adapters`" in " ".join(
        done.output.split()
    ), done.output


def test_the_cli_reports_a_doctored_table_as_bad_input(table: Path, tmp_path: Path) -> None:
    path = _edit(table, tmp_path / "doctored.csv", 3, "ood", "")
    done = CliRunner().invoke(cli, ["adapters", "report", "--scores", str(path), "--out", str(tmp_path / "out")])
    assert done.exit_code == 2 and "column 'ood', line 3" in " ".join(done.output.split()), done.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
