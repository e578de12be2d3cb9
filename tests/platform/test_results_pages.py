"""``rvu report``: every table keeps the stamp of the run that measured it, and a page is never silently stale."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from rvu_pipelines.cli_report import report
from rvu_pipelines.machine import write_stamp
from rvu_pipelines.results_pages import RESULT_SOURCES, source_by_name, table_stamp, write_result_pages

STAMPED = "Measured 2026-11-27 on AMD EPYC, 2 cores (x86_64) at commit 52b4a08abcde: `python scripts/x.py --n 3`."


def _table(state: Path, name: str, text: str) -> Path:
    path = state / source_by_name(name).path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_table_with_its_own_stamp_keeps_it_once(tmp_path: Path) -> None:
    _table(tmp_path / "state", "spectral-controls", f"{STAMPED}\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    outcomes = {o.source.name: o for o in write_result_pages(tmp_path / "state", tmp_path / "out")}
    assert outcomes["spectral-controls"].status == "written" and outcomes["spectral-controls"].stamp == STAMPED
    page = (tmp_path / "out" / "spectral-controls.md").read_text()
    assert page.count("Measured 2026-11-27") == 1 and "| 1 | 2 |" in page and "make spectral" in page


def test_a_stamp_file_beside_the_table_stamps_it(tmp_path: Path) -> None:
    table = _table(tmp_path / "state", "memory-poisoning-paper-table", "| x |\n|---|\n| 0.5 |\n")
    write_stamp(table.parent, command="python scripts/memory_poisoning_study.py --no-llm")
    stamp = table_stamp(table)
    assert stamp.startswith("Measured ") and "scripts/memory_poisoning_study.py --no-llm" in stamp
    assert json.loads((table.parent / "stamp.json").read_text())["machine"]  # the machine is recorded


def test_an_unstamped_table_says_so_and_a_missing_one_keeps_the_committed_page(tmp_path: Path) -> None:
    state, out = tmp_path / "state", tmp_path / "out"
    _table(state, "adapter-gate", "| gate |\n|---|\n")
    out.mkdir()
    kept = out / "detector-validity.md"
    kept.write_text(f"<!-- generated -->\n\n*{STAMPED}* Source: x\n\n| old |\n")
    outcomes = {o.source.name: o for o in write_result_pages(state, out)}
    assert outcomes["adapter-gate"].stamp.startswith("Unstamped: written ")
    assert outcomes["detector-validity"].status == "kept" and outcomes["detector-validity"].stamp == STAMPED
    assert kept.read_text().endswith("| old |\n")  # not overwritten
    assert outcomes["minja-agent"].status == "missing"
    assert "make minja-agent" in (out / "minja-agent.md").read_text()
    index = (out / "index.md").read_text()
    assert index.count("\n| [") == len(RESULT_SOURCES) and "| kept |" in index and "| not here |" in index
    # a second report over the same state: a "not here" page stays not here, it is never "kept"
    again = {o.source.name: o for o in write_result_pages(state, out)}
    assert again["minja-agent"].status == "missing" and again["detector-validity"].status == "kept"


def test_the_command_writes_the_pages_and_refuses_a_missing_state_folder(tmp_path: Path) -> None:
    _table(tmp_path / "state", "spectral-hfer-cost", f"{STAMPED}\n\n| cost |\n")
    runner = CliRunner()
    done = runner.invoke(report, ["--state", str(tmp_path / "state"), "--out", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "out" / "spectral-hfer-cost.md").is_file() and (tmp_path / "out" / "index.md").is_file()
    refused = runner.invoke(report, ["--state", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert refused.exit_code == 2 and "No state folder" in refused.output
