"""``rvu scale up|down|status``: the local scale profile (PostgreSQL, MLflow server, Dagster webserver + daemon)."""

from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()


def _show(states: list) -> None:
    table = Table(title="scale profile")
    for column in ("service", "state", "pid", "address", "log"):
        table.add_column(column)
    for state in states:
        mark = "[green]running[/green]" if state.running else "[red]stopped[/red]"
        table.add_row(state.name, mark, str(state.pid or ""), escape(state.address), escape(str(state.log)))
    console.print(table)


@click.group()
def scale() -> None:
    """The local scale profile on loopback: PostgreSQL (Dagster runs + event log, MLflow, the provenance store),
    an MLflow tracking server, the Dagster webserver and daemon. Data under <RVU_HOME>/scale; ports from
    RVU_SCALE_POSTGRES_PORT / RVU_SCALE_MLFLOW_PORT / RVU_SCALE_DAGSTER_PORT."""


@scale.command()
def up() -> None:
    """Start what is not running (idempotent) and print where everything is."""
    from rvu_pipelines.scale.profile import ScaleProfile

    profile = ScaleProfile()
    with console.status("starting PostgreSQL, MLflow, the Dagster webserver and daemon"):
        states = profile.up()
    _show(states)
    console.print(f"use it from a shell: [bold]source {escape(str(profile.env_file))}[/bold]", highlight=False)


@scale.command()
def down() -> None:
    """Stop every service of the profile (data stays under <RVU_HOME>/scale)."""
    from rvu_pipelines.scale.profile import ScaleProfile

    profile = ScaleProfile()
    profile.down()
    _show(profile.status())


@scale.command()
def status() -> None:
    """What runs, with pid, address and log."""
    from rvu_pipelines.scale.profile import ScaleProfile

    _show(ScaleProfile().status())
