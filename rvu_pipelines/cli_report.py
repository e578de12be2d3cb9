"""``rvu report``: the docs' result pages written from what the studies produced (``results_pages``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

console = Console()


@click.command("report")
@click.option(
    "--state",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The state folder the studies wrote into (default: RVU_HOME, else .rvu).",
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("docs/results"),
              show_default=True, help="Where the result pages go.")  # fmt: skip
def report(state: Path | None, out: Path) -> None:
    """Write docs/results/ from the studies' latest tables, each with its stamp (commit, date, machine)."""
    from rvu_pipelines.paths import state_dir
    from rvu_pipelines.results_pages import write_result_pages

    folder = state if state is not None else state_dir()
    if not folder.is_dir():
        console.print(f"[red]No state folder at {folder}: run a study (e.g. `make run`) or pass --state.[/red]")
        sys.exit(2)
    outcomes = write_result_pages(folder, out, command="rvu report " + " ".join(sys.argv[2:]))
    table = Table("result", "this report", "measured")
    for outcome in outcomes:
        status = {"written": "[green]regenerated[/green]", "kept": "kept", "missing": "[yellow]not here[/yellow]"}
        table.add_row(outcome.source.name, status[outcome.status], outcome.stamp or f"run `{outcome.source.make}`")
    console.print(table)
    console.print(f"Pages in {out} (index: {out / 'index.md'}); `make docs` builds the site with them.")
