"""Every benchmark's headline ratios side by side: one table from the JSON files the benches left (``make bench``'s
last step), and ``performance.md`` beside them, the markdown README's performance table is pasted from.

    .venv/bin/python benchmarks/bench_report.py [--results-dir .rvu/bench]

Benches whose file is missing, or older than the newest by more than a day, are warned about and still shown.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import BenchResult, add_results_dir_argument, load  # noqa: E402

# bench -> its make target, in `make bench`'s order; bench-sweep (scale_sweep) is apart, shown last when it has run
MAKE_BENCH = {
    "closure": "bench-closure",
    "monitor": "bench-monitor",
    "detectors": "bench-detectors",
    "agent_speed": "bench-agent",
    "cell_order": "bench-cell-order",
    "llama_cpu": "bench-llama",
    "llm_throughput": "bench-llm-throughput",
    "memsad": "bench-memsad",
    "spectral": "bench-spectral",
    "gate": "bench-gate",
    "store_engines": "bench-stores",
}
ORDER = (*MAKE_BENCH, "scale_sweep")
STALE = timedelta(days=1)


def load_all(folder: Path) -> tuple[list[BenchResult], list[str]]:
    """The results in the folder, in ``make bench``'s order (unknown benches after, by name), and the files that
    could not be read (the report still prints the rest)."""
    results, unreadable = [], []
    for path in sorted(folder.glob("*.json")):
        try:
            results.append(load(path))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            unreadable.append(f"{path.name}: unreadable ({exc})")
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(results, key=lambda r: (rank.get(r.bench, len(ORDER)), r.bench)), unreadable


def warnings(results: list[BenchResult]) -> list[str]:
    """Missing benches, benches with no rows, and files more than a day older than the newest."""
    found = {r.bench for r in results}
    out = [f"{name}: no results file (`make {target}`)" for name, target in MAKE_BENCH.items() if name not in found]
    out += [f"{r.bench}: recorded no rows ({r.command})" for r in results if not r.rows]
    if results:
        newest = max(r.when for r in results)
        out += [
            f"{r.bench}: from {r.timestamp}, {(newest - r.when).days} day(s) older than the newest"
            for r in results
            if newest - r.when > STALE
        ]
    return out


def number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def ratio(value: float) -> str:
    return f"{value:,.2f}×" if value >= 0.01 else f"{value:.2g}×"


def machines(results: list[BenchResult]) -> str:
    seen = {f"{r.machine.get('cpu') or r.machine.get('arch')}, {r.machine.get('cpus')} CPUs" for r in results}
    return "; ".join(sorted(seen)) or "unknown"


def render_table(results: list[BenchResult]) -> Table:
    table = Table(title="make bench: new vs baseline (ratio > 1: new is better)")
    for column in ("bench", "what", "baseline", "new", "unit", "ratio"):
        table.add_column(column, justify="right" if column == "ratio" else "left")
    for result in results:
        for row in result.rows:
            table.add_row(
                result.bench,
                row.what,
                f"{row.baseline_label}: {number(row.baseline)}",
                f"{row.new_label}: {number(row.new)}",
                row.unit,
                ratio(row.ratio),
            )
    return table


def render_markdown(results: list[BenchResult]) -> str:
    """README's performance table: a line saying when and where, then one row per headline, the command once per
    bench."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    times = sorted(r.timestamp for r in results)
    when = f"{times[0]} to {times[-1]}" if times and times[0] != times[-1] else (times[0] if times else "never")
    lines = [
        f"Measured {when} (UTC) on {machines(results)}; ratio > 1 means the new path is better.",
        "",
        "| bench | what | baseline | new | unit | ratio | command |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for i, row in enumerate(result.rows):
            command = f"`{result.command}`" if i == 0 else ""
            lines.append(
                f"| {result.bench} | {cell(row.what)} | {cell(row.baseline_label)}: {number(row.baseline)} | "
                f"{cell(row.new_label)}: {number(row.new)} | {row.unit} | {ratio(row.ratio)} | {cell(command)} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_results_dir_argument(parser)
    args = parser.parse_args(argv)
    folder: Path = args.results_dir
    folder.mkdir(parents=True, exist_ok=True)
    results, unreadable = load_all(folder)
    console = Console()
    console.print(render_table(results))
    for line in unreadable + warnings(results):
        console.print(f"[yellow]warning[/yellow]: {line}", highlight=False)
    out = folder / "performance.md"
    out.write_text(render_markdown(results), encoding="utf-8")
    console.print(f"markdown table for README: {out}", highlight=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
