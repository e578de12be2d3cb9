"""Each benchmark's headline old-vs-new rows, saved as JSON so ``bench_report.py`` can put every ratio in one table.

A bench calls ``record(__file__, rows, args.results_dir)`` after printing its own output; the file
``<results dir>/<name>.json`` (``bench_closure.py`` -> ``closure.json``) is replaced atomically by each run.
Plain Python on purpose: the benches run outside Dagster and the report must load without the library.
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rvu_pipelines.machine import machine

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS_DIR = REPO / ".rvu" / "bench"


@dataclass(frozen=True)
class Row:
    """One measured quantity, baseline path vs new path. ``ratio`` > 1 always means the new path is better."""

    what: str
    baseline_label: str
    baseline: float
    new_label: str
    new: float
    unit: str
    higher_is_better: bool
    ratio: float = field(init=False)

    def __post_init__(self) -> None:
        for name in ("baseline", "new"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{self.what!r}: {name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))  # numpy scalars too: the JSON holds plain floats
        divisor, name = (self.baseline, "baseline") if self.higher_is_better else (self.new, "new")
        if divisor <= 0:
            raise ValueError(f"{self.what!r}: {name} must be positive to compute a ratio, got {divisor!r}")
        object.__setattr__(
            self, "ratio", self.new / self.baseline if self.higher_is_better else self.baseline / self.new
        )


@dataclass(frozen=True)
class BenchResult:
    """What one bench run recorded: its rows, and the command, time and machine that produced them."""

    bench: str
    command: str
    timestamp: str  # ISO 8601, UTC
    machine: dict[str, str | int | None]
    rows: list[Row]

    @property
    def when(self) -> datetime:
        return datetime.fromisoformat(self.timestamp)


def command_line(script: str | Path, argv: Sequence[str]) -> str:
    """The command to run again, paths relative to the repository where they lie in it."""

    def relative(path: str | Path) -> str:
        try:
            return str(Path(path).absolute().relative_to(REPO))
        except ValueError:
            return str(path)

    return shlex.join([relative(sys.executable), relative(script), *argv])


def add_results_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=DEFAULT_RESULTS_DIR,
        help=f"where the headline rows are saved for bench_report.py (default {DEFAULT_RESULTS_DIR})",
    )


def bench_name(script: str | Path) -> str:
    return Path(script).stem.removeprefix("bench_")


def record(
    script: str | Path, rows: Sequence[Row], results_dir: Path | None = None, argv: Sequence[str] | None = None
) -> Path:
    """Save ``rows`` as ``<results_dir>/<bench>.json`` (temp file + rename: a reader never sees half a file)."""
    folder = Path(results_dir or DEFAULT_RESULTS_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    result = BenchResult(
        bench=bench_name(script),
        command=command_line(script, sys.argv[1:] if argv is None else argv),
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        machine=machine(),
        rows=list(rows),
    )
    path = folder / f"{result.bench}.json"
    handle, temp = tempfile.mkstemp(dir=folder, prefix=f".{result.bench}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(asdict(result), out, indent=1)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    print(f"\nrecorded {len(result.rows)} headline row(s) in {path}")
    return path


def load(path: Path) -> BenchResult:
    """A results file back as typed rows; the ratio is recomputed (and the values validated) from the values."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    rows = [Row(**{k: v for k, v in row.items() if k != "ratio"}) for row in data["rows"]]
    return BenchResult(data["bench"], data["command"], data["timestamp"], data["machine"], rows)
