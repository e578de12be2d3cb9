"""Stage timings of the latest run of a Dagster job, slowest first (``make run`` prints them at the end).

    .venv/bin/python scripts/run_timings.py [--job default_profile_job] [--top 12]

Reads the Dagster instance in $DAGSTER_HOME (the Makefile sets it): wall time of the run, then each step's
status and duration. Outside the library because it talks to Dagster.
"""

from __future__ import annotations

import argparse
import sys

from dagster import DagsterInstance, RunsFilter
from rich.console import Console
from rich.table import Table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", default="default_profile_job")
    parser.add_argument("--top", type=int, default=12, help="steps to list (the rest are summed)")
    args = parser.parse_args(argv)
    console = Console()
    with DagsterInstance.get() as instance:
        runs = instance.get_runs(filters=RunsFilter(job_name=args.job), limit=1)
        if not runs:
            console.print(f"No run of {args.job} in this Dagster instance ($DAGSTER_HOME).")
            return 1
        run = runs[0]
        stats = instance.get_run_stats(run.run_id)
        steps = sorted(
            (s for s in instance.get_run_step_stats(run.run_id) if s.start_time and s.end_time),
            key=lambda s: s.end_time - s.start_time,  # type: ignore[operator]
            reverse=True,
        )
    wall = (stats.end_time or 0.0) - (stats.launch_time or stats.start_time or 0.0)
    table = Table("step", "status", "seconds", title=f"{args.job} {run.run_id[:8]}: {run.status.value}, {wall:.1f} s")
    for step in steps[: args.top]:
        status = step.status.value if step.status else "?"
        table.add_row(step.step_key, status, f"{step.end_time - step.start_time:.1f}")  # type: ignore[operator]
    rest = steps[args.top :]
    if rest:
        table.add_row(f"{len(rest)} other steps", "", f"{sum(s.end_time - s.start_time for s in rest):.1f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
