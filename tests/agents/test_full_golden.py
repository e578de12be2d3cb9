"""The full attack table's golden file is made from the tables of several runs: each run's cells are added, every
other cell kept, a cell a later run gives other values is named, other weights are refused, and the attack study's
check then passes for each run it was made from."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import polars as pl
import pytest

from rvu_pipelines.agents.regression import compare_to_golden, load_tolerance
from rvu_pipelines.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("full_golden", REPO / "scripts" / "full_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(benchmark: str, attack: str, defense: str, asr: float, utility: float = 0.5) -> dict[str, object]:
    return {
        "profile": "tiny",
        "benchmark": benchmark,
        "attack": attack,
        "defense": defense,
        "n": 100,
        "errors": 0,
        "asr": asr,
        "utility": utility,
        "code_version": "abc",
    }


def _store(state: Path, run: str, rows: list[dict[str, object]]) -> pl.DataFrame:
    folder = state / "attacks" / "full" / "tiny" / run
    folder.mkdir(parents=True)
    table = pl.DataFrame(rows)
    table.write_parquet(folder / "table.parquet")
    return table


def test_runs_make_one_golden_that_each_run_matches(tmp_path: Path) -> None:
    script, state, out = _script(), tmp_path / "state", tmp_path / "golden.json"
    universal = _store(
        state,
        "universal",
        [
            _row("injecagent_dh", "gcg_universal_call", "vanilla", 0.71),
            _row("injecagent_ds", "planted_call", "vanilla", 0.1),
        ],
    )
    defenses = _store(
        state,
        "defenses",
        [
            _row("injecagent_dh", "gcg_universal_call", "vanilla", 0.71),
            _row("injecagent_dh", "gcg_universal_call", "rvg", 0.0),
        ],
    )
    path, changed = script.write(["universal", "defenses"], "tiny", state, out)
    golden = json.loads(path.read_text())
    assert changed == [] and sorted(golden["cells"]) == [
        "injecagent_dh/gcg_universal_call/rvg",
        "injecagent_dh/gcg_universal_call/vanilla",
        "injecagent_ds/planted_call/vanilla",
    ]
    assert golden["cells"]["injecagent_dh/gcg_universal_call/rvg"] == {
        "asr": 0.0,
        "errors": 0,
        "n": 100,
        "utility": 0.5,
    }
    for table in (universal, defenses):  # what the study's check compares: the cells the run holds
        present = {f"{r['benchmark']}/{r['attack']}/{r['defense']}" for r in table.iter_rows(named=True)}
        sampled = {**golden, "cells": {k: v for k, v in golden["cells"].items() if k in present}}
        assert compare_to_golden(table, sampled, load_tolerance()) == []
    # a later run of one run's cells that does not reproduce them: named, and its values written
    _store(state, "again", [_row("injecagent_dh", "gcg_universal_call", "vanilla", 0.65)])
    _, changed = script.write(["again"], "tiny", state, out)
    assert changed == ["injecagent_dh/gcg_universal_call/vanilla"]
    cells = json.loads(out.read_text())["cells"]
    assert cells["injecagent_dh/gcg_universal_call/vanilla"]["asr"] == 0.65 and len(cells) == 3


def test_the_check_makes_the_file_anew_from_its_runs_and_names_what_moved_or_went_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make attacks-full`` ends in ``--check``: the runs the file records, united as writing unites them, must give
    the committed cells; a moved rate, a cell no run produces any more and a run without its table each fail."""
    script, state, out = _script(), tmp_path / "state", tmp_path / "golden.json"
    rows = {
        "universal": [_row("injecagent_dh", "gcg_universal_call", "vanilla", 0.71)],
        "defenses": [
            _row("injecagent_dh", "gcg_universal_call", "vanilla", 0.71),
            _row("injecagent_dh", "gcg_universal_call", "rvg", 0.0),
        ],
    }
    for run, cells in rows.items():
        _store(state, run, cells)
    script.write(["universal", "defenses"], "tiny", state, out)
    assert json.loads(out.read_text())["runs"] == ["defenses", "universal"]
    args = ["--state", str(state), "--out", str(out)]
    assert script.main(["--list-runs", *args]) == 0
    assert capsys.readouterr().out.split() == ["defenses", "universal"]
    assert script.main(["--check", *args]) == 0
    assert "2 cells from 2 runs" in capsys.readouterr().out

    table = state / "attacks" / "full" / "tiny" / "defenses" / "table.parquet"
    pl.DataFrame([rows["defenses"][0], {**rows["defenses"][1], "asr": 0.2}]).write_parquet(table)
    assert script.main(["--check", *args]) == 1
    assert "| injecagent_dh/gcg_universal_call/rvg | asr | 0.000 | 0.200 |" in capsys.readouterr().out
    pl.DataFrame(rows["defenses"][:1]).write_parquet(table)  # the gate's cell no longer produced
    assert script.main(["--check", *args]) == 1
    assert "| injecagent_dh/gcg_universal_call/rvg | n | 100 | missing |" in capsys.readouterr().out
    pl.DataFrame(rows["defenses"]).write_parquet(table)
    assert script.main(["--check", "--run", "universal", *args]) == 1  # fewer runs than made it: cells missing
    assert "| injecagent_dh/gcg_universal_call/rvg | n | 100 | missing |" in capsys.readouterr().out
    table.unlink()
    assert script.main(["--check", *args]) == 2
    assert "No table for run 'defenses'" in capsys.readouterr().err
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({k: v for k, v in json.loads(out.read_text()).items() if k != "runs"}))
    assert script.main(["--check", "--state", str(state), "--out", str(bare)]) == 2
    assert "records no runs" in capsys.readouterr().err
    assert script.main(["--check", "--run", "universal", "--state", str(state), "--out", str(bare)]) == 1


def test_the_committed_file_names_the_runs_make_attacks_full_runs() -> None:
    """Each run the committed golden file records has its run config, whose `name` is the run."""
    import yaml

    from rvu_pipelines.agents.regression import golden_full_path

    runs = _script().recorded_runs(golden_full_path("tiny"))
    assert len(runs) >= 5
    for run in runs:
        config = yaml.safe_load((REPO / "configs" / "runs" / f"attacks_{run}.yaml").read_text())
        assert config["ops"]["attack_table_full"]["config"]["name"] == run


def test_other_weights_and_a_missing_run_are_refused(tmp_path: Path) -> None:
    script, state, out = _script(), tmp_path / "state", tmp_path / "golden.json"
    _store(state, "universal", [_row("injecagent_dh", "planted_call", "vanilla", 0.32)])
    out.write_text(json.dumps({"profile": "tiny", "model_sha256": "0" * 64, "cells": {}}))
    with pytest.raises(ConfigError, match="weights"):
        script.write(["universal"], "tiny", state, out)
    with pytest.raises(ConfigError, match="No table for run 'nowhere'"):
        script.write(["nowhere"], "tiny", state, tmp_path / "new.json")
    assert script.main(["--run", "nowhere", "--state", str(state), "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def test_the_committed_cells_are_what_the_attack_studys_check_compares_with() -> None:
    """The committed golden file loads, names only known benchmarks, attacks and defenses, and the study's
    ``matches_golden_full`` check passes on a run that reproduces some of its cells and fails when one moves."""
    from assets.attack_study import _golden_check, golden_full_path
    from rvu_pipelines.agents.regression import load_golden, split_cell
    from rvu_pipelines.scenarios.axes import ATTACKS, BENCHMARKS, DEFENSES

    golden = load_golden(golden_full_path("tiny"))
    cells = [(*split_cell(cell), values) for cell, values in sorted(golden["cells"].items())]
    assert cells and all(b in BENCHMARKS and a in ATTACKS and d in DEFENSES for b, a, d, _ in cells)
    assert all(values["n"] >= 100 for *_, values in cells)  # the published table's n per benchmark
    rows = [{"benchmark": b, "attack": a, "defense": d, **values} for b, a, d, values in cells[:3]]
    assert _golden_check(pl.DataFrame(rows), "tiny").passed
    moved = [{**rows[0], "asr": rows[0]["asr"] + 0.2}, *rows[1:]]
    failed = _golden_check(pl.DataFrame(moved), "tiny")
    assert not failed.passed and rows[0]["benchmark"] in failed.metadata["drifts"].value


def test_a_run_is_held_only_to_the_golden_cells_it_measured_on_a_sample_of_their_size() -> None:
    """A default run (five scenarios per benchmark) is another measurement than a published cell's 100, and a cell
    the golden file lacks is new: neither is a drift. A cell on the same sample that moved is."""
    from rvu_pipelines.agents.regression import compare_on_the_same_sample

    golden = {
        "cells": {
            "injecagent_dh/native/vanilla": {"n": 100, "errors": 0, "asr": 0.10, "utility": 0.5},
            "injecagent_dh/native/rvg": {"n": 98, "errors": 2, "asr": 0.0, "utility": 0.4},
            "bipia_email/native/vanilla": {"n": 100, "errors": 0, "asr": 0.02, "utility": 0.01},
        }
    }
    rows = [
        {**_row("injecagent_dh", "native", "vanilla", 0.6), "n": 5},  # the default run's size: not comparable
        {**_row("injecagent_dh", "native", "rvg", 0.0, 0.4), "n": 98, "errors": 2},  # 100 in all: compared
        _row("agentdojo_travel", "native", "vanilla", 0.0),  # not in the golden file yet
    ]
    result = compare_on_the_same_sample(pl.DataFrame(rows), golden, load_tolerance())
    assert result.compared == ["injecagent_dh/native/rvg"]
    assert result.other_sample_size == ["injecagent_dh/native/vanilla"]
    assert result.not_in_golden == ["agentdojo_travel/native/vanilla"]
    assert result.drifts == []
    moved = [rows[0], {**rows[1], "asr": 0.5}, rows[2]]
    drifted = compare_on_the_same_sample(pl.DataFrame(moved), golden, load_tolerance())
    assert [(d.cell, d.metric) for d in drifted.drifts] == [("injecagent_dh/native/rvg", "asr")]


def test_a_nightly_sample_is_held_to_the_golden_rates_by_fishers_exact_test() -> None:
    """The nightly sample's cells (two scenarios each by default) meet the full table's cells by ASR: a rate that
    cannot be told apart passes, one that moved beyond the sampling error of both sides is named, Holm over cells."""
    from assets.attacks import _full_golden_rates_check
    from rvu_pipelines.agents.regression import asr_against_golden, golden_full_path, load_golden

    golden = {
        "cells": {
            "injecagent_dh/native/vanilla": {"n": 100, "errors": 0, "asr": 0.0, "utility": 0.5},
            "bipia_email/native/vanilla": {"n": 100, "errors": 0, "asr": 0.02, "utility": 0.01},
        }
    }
    same = [
        {**_row("injecagent_dh", "native", "vanilla", 0.0), "n": 2},
        {**_row("bipia_email", "native", "vanilla", 0.5), "n": 2},
    ]
    compared = asr_against_golden(pl.DataFrame(same), golden)
    assert [(c.cell, c.successes, c.n, c.golden_successes) for c in compared] == [
        ("bipia_email/native/vanilla", 1, 2, 2),
        ("injecagent_dh/native/vanilla", 0, 2, 0),
    ]
    assert not any(c.differs for c in compared)  # 1/2 against 2/100: Fisher p = 0.06
    moved = [{**same[0], "n": 10, "asr": 0.5}, same[1]]  # 5/10 where the golden run had 0/100
    flagged = {c.cell: c for c in asr_against_golden(pl.DataFrame(moved), golden)}
    assert flagged["injecagent_dh/native/vanilla"].differs and flagged["injecagent_dh/native/vanilla"].p_holm < 1e-4
    assert not flagged["bipia_email/native/vanilla"].differs

    committed = load_golden(golden_full_path("tiny"))
    cell, values = sorted(committed["cells"].items())[0]
    benchmark, attack, defense = cell.split("/")
    row = {**_row(benchmark, attack, defense, values["asr"], values["utility"]), "n": 2}
    check = _full_golden_rates_check(pl.DataFrame([row]), "tiny")
    assert check.passed and check.metadata["cells_compared"].value == 1
