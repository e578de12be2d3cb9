"""``rvu memory incident``: the memory monitor's audit log as an incident log for ``rvu recover``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from rvu_pipelines.errors import MemoryMonitorError

console = Console()


def _namespace_key(flag: str) -> tuple[str, str]:
    namespace, sep, key = flag.partition("/")
    if not sep or not namespace or not key:
        raise MemoryMonitorError(f"--flag {flag!r}: write it as namespace/key (e.g. shared/camera_tip)")
    return namespace, key


@click.group()
def memory() -> None:
    """The memory reference monitor's audit log."""


@memory.command("incident")
@click.argument("audit", type=click.Path(exists=True, dir_okay=False))
@click.option("--flag", "flags", multiple=True, help="A flagged write as namespace/key (repeatable): a recovery seed.")
@click.option(
    "--flag-value", "values", multiple=True, help="The sha256 of a flagged value (repeatable): that exact write."
)
@click.option("--out", "out", type=click.Path(dir_okay=False), required=True, help="The incident log to write.")
@click.option("--expected-head", default=None, help="The chain head recorded elsewhere: refuse a truncated log.")
@click.option("--shared", default="shared", show_default=True, help="The monitor's shared namespace.")
def incident(
    audit: str, flags: tuple[str, ...], values: tuple[str, ...], out: str, expected_head: str | None, shared: str
) -> None:
    """Verify the audit chain in AUDIT (a DuckDB file) and write the incident it records, the flagged writes as
    seeds; then run `rvu recover OUT`. Exit 0 written, 2 bad input (a broken chain, a flag matching no write)."""
    from rvu_pipelines.memory.incident_export import export_audit_incident, read_audit_file

    keys = [_namespace_key(flag) for flag in flags]
    exported = export_audit_incident(
        read_audit_file(audit),
        Path(out),
        flagged_keys=keys,
        flagged_values=values,
        shared=shared,
        expected_head=expected_head,
    )
    skipped = ", ".join(f"{n} {kind}" for kind, n in exported.skipped.items()) or "none"
    console.print(
        f"{escape(str(exported.path))}: {exported.n_actions} actions from {exported.n_records} audit records, "
        f"{len(exported.seeds)} seed(s) ({escape(', '.join(exported.seeds))}); records without an action: {skipped}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"next: rvu recover {escape(str(exported.path))}", highlight=False)
