"""`make bench`'s one table: each bench's headline rows saved as JSON (benchmarks/bench_results.py) and the report
that puts them side by side and writes README's performance table (benchmarks/bench_report.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


def load_script(name: str) -> ModuleType:
    """benchmarks/ is a folder of scripts, not a package: import one by path, under the name its siblings use."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


results = load_script("bench_results")
report = load_script("bench_report")
Row = results.Row


def rows() -> list:
    return [
        Row("closure v2, 10,000 entries", "seed", 0.5, "ours", 0.01, "s", False),
        Row("writes/s batched", "goal", 5_000, "MEMSAD", 20_000, "writes/s", True),
    ]


def test_record_writes_one_file_per_bench_and_load_reads_it_back(tmp_path: Path) -> None:
    path = results.record(BENCHMARKS / "bench_example.py", rows(), tmp_path, argv=["--sizes", "10 000"])
    assert path == tmp_path / "example.json" and sorted(tmp_path.iterdir()) == [path]  # no temp file left
    data = json.loads(path.read_text())
    assert data["bench"] == "example"
    assert data["command"].endswith("benchmarks/bench_example.py --sizes '10 000'")  # relative, re-runnable
    assert data["machine"]["cpus"] == os.cpu_count()
    assert datetime.fromisoformat(data["timestamp"]).utcoffset() == timedelta(0)
    assert [row["ratio"] for row in data["rows"]] == pytest.approx([50.0, 4.0])
    assert results.load(path).rows == rows()
    # a second run replaces the first
    results.record(BENCHMARKS / "bench_example.py", rows()[:1], tmp_path, argv=[])
    assert len(results.load(path).rows) == 1


def test_the_ratio_is_above_one_when_the_new_path_is_better_in_either_direction() -> None:
    assert Row("latency", "old", 10.0, "new", 2.0, "ms", False).ratio == pytest.approx(5.0)  # lower is better
    assert Row("latency", "old", 2.0, "new", 10.0, "ms", False).ratio == pytest.approx(0.2)
    assert Row("throughput", "old", 100, "new", 300, "tok/s", True).ratio == pytest.approx(3.0)  # higher is better
    assert Row("throughput", "old", 300, "new", 100, "tok/s", True).ratio == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("baseline", "new", "higher", "message"),
    [
        (1.0, math.nan, False, "'x': new must be a finite number, got nan"),
        (math.inf, 1.0, True, "'x': baseline must be a finite number, got inf"),
        ("3", 1.0, True, "'x': baseline must be a finite number, got '3'"),
        (1.0, 0.0, False, "'x': new must be positive to compute a ratio, got 0.0"),
        (-1.0, 2.0, True, "'x': baseline must be positive to compute a ratio, got -1.0"),
    ],
)
def test_a_value_that_makes_no_ratio_is_refused(baseline: object, new: object, higher: bool, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Row("x", "old", baseline, "new", new, "ms", higher)


def test_report_prints_one_table_and_writes_markdown_with_the_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    memsad = [Row("writes/s batched (2,000)", "goal", 5_000, "MEMSAD", 20_000, "writes/s", True)]
    results.record(BENCHMARKS / "bench_memsad.py", memsad, tmp_path, argv=["--writes", "2000"])
    closure = results.record(BENCHMARKS / "bench_closure.py", rows()[:1], tmp_path, argv=["--sizes", "10000"])
    stale = json.loads(closure.read_text())
    stale["timestamp"] = (datetime.fromisoformat(stale["timestamp"]) - timedelta(days=3)).isoformat()
    closure.write_text(json.dumps(stale))

    assert report.main(["--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "50.00×" in out and "4.00×" in out
    assert "monitor: no results file (`make bench-monitor`)" in out
    assert "closure: from " in out and "3 day(s) older than the newest" in out
    lines = (tmp_path / "performance.md").read_text().splitlines()
    assert lines[0].startswith(f"Measured {stale['timestamp']} to ") and f"{os.cpu_count()} CPUs" in lines[0]
    assert lines[2] == "| bench | what | baseline | new | unit | ratio | command |"
    assert lines[4:] == [  # Makefile order: closure before memsad, the command once per bench
        f"| closure | closure v2, 10,000 entries | seed: 0.5 | ours: 0.01 | s | 50.00× | `{stale['command']}` |",
        "| memsad | writes/s batched (2,000) | goal: 5,000 | MEMSAD: 20,000 | writes/s | 4.00× | "
        f"`{json.loads((tmp_path / 'memsad.json').read_text())['command']}` |",
    ]


def test_make_bench_runs_every_bench_and_the_report_last() -> None:
    makefile = (REPO / "Makefile").read_text()
    bench = re.search(r"^bench: (.+)\n\t(.+)$", makefile, re.M)
    assert bench is not None
    assert bench.group(1).split() == list(report.MAKE_BENCH.values())
    assert bench.group(2) == "$(BIN)/python benchmarks/bench_report.py"
    for name, target in report.MAKE_BENCH.items():
        assert re.search(rf"^{target}: setup\n\t\$\(BIN\)/python benchmarks/bench_{name}\.py$", makefile, re.M)
    scripts = {p.stem.removeprefix("bench_") for p in BENCHMARKS.glob("bench_*.py")} - {"results", "report"}
    assert scripts == set(report.ORDER)
    for name in scripts:  # every bench records its rows where the report reads them
        text = (BENCHMARKS / f"bench_{name}.py").read_text()
        assert "add_results_dir_argument(parser)" in text and "(__file__, " in text, name


def test_the_smallest_real_benchmark_records_its_rows(tmp_path: Path) -> None:
    """bench_closure at 2,000 entries against the seed's method (each seed stage capped at 1 s): a few seconds."""
    command = [sys.executable, "benchmarks/bench_closure.py", "--sizes", "2000", "--methods", "seed", "ours"]
    command += ["--repeats", "1", "--cap", "1", "--workdir", str(tmp_path / "work"), "--results-dir", str(tmp_path)]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True, timeout=300)
    result = results.load(tmp_path / "closure.json")
    assert (
        result.bench == "closure" and " benchmarks/bench_closure.py --sizes 2000 --methods seed ours" in result.command
    )
    assert [row.what for row in result.rows] == ["closure v2, 2,000 entries", "closure + risk + tiers, 2,000 entries"]
    assert all(row.baseline_label.startswith("seed") and row.ratio > 0 and row.unit == "s" for row in result.rows)
    assert report.main(["--results-dir", str(tmp_path)]) == 0
    assert "| closure | closure v2, 2,000 entries | seed, SQLite per node" in (tmp_path / "performance.md").read_text()
