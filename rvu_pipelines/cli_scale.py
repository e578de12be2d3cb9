"""``rvu scale up|down|status``: the local scale profile (PostgreSQL, MLflow server, Dagster webserver + daemon)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rvu_pipelines.errors import ConfigError
from rvu_pipelines.settings import env_flag, env_value

if TYPE_CHECKING:
    from rvu_pipelines.scale.profile import Ports, ScaleProfile

console = Console()


def configured_ports() -> Ports:
    """The profile's ports from the RVU_SCALE_*_PORT settings (each refused by name unless 1024-65535)."""
    from rvu_pipelines.scale.profile import Ports

    def port(name: str, default: int) -> int:
        raw = env_value(name) or str(default)
        if not raw.isdigit() or not 1024 <= int(raw) <= 65535:
            raise ConfigError(f"{name}={raw!r}: give a port number between 1024 and 65535.")
        return int(raw)

    defaults = Ports()
    return Ports(
        port("RVU_SCALE_POSTGRES_PORT", defaults.postgres),
        port("RVU_SCALE_MLFLOW_PORT", defaults.mlflow),
        port("RVU_SCALE_DAGSTER_PORT", defaults.dagster),
        port("RVU_SCALE_REDIS_PORT", defaults.redis),
        port("RVU_SCALE_LLM_PORT", defaults.llm),
    )


def configured_profile() -> ScaleProfile:
    """The scale profile as the RVU_SCALE_* settings describe it (ports, celery workers, LLM servers)."""
    from rvu_pipelines.scale.profile import ScaleProfile

    raw = env_value("RVU_SCALE_CELERY_WORKERS") or "2"
    if not raw.isdigit():
        raise ConfigError(f"RVU_SCALE_CELERY_WORKERS={raw!r}: give a whole number (0: no celery, multiprocess).")
    return ScaleProfile(
        ports=configured_ports(), workers=int(raw), llm_servers=env_flag("RVU_SCALE_LLM_SERVERS", default=True)
    )


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
    profile = configured_profile()
    with console.status("starting PostgreSQL, MLflow, the Dagster webserver and daemon"):
        states = profile.up()
    _show(states)
    console.print(f"use it from a shell: [bold]source {escape(str(profile.env_file))}[/bold]", highlight=False)


@scale.command()
def down() -> None:
    """Stop every service of the profile (data stays under <RVU_HOME>/scale)."""
    profile = configured_profile()
    profile.down()
    _show(profile.status())


@scale.command()
def status() -> None:
    """What runs, with pid, address and log."""
    _show(configured_profile().status())
