"""The `rvu` command: check data and models, recover from incidents, and summarise what the last runs produced.

User-caused problems (missing data, wrong checksum, bad config) print one clear message and exit
non-zero; a traceback is never the only thing a user sees. Exit codes: 0 ok; 1 a check failed
(verification failed, recovery refused: e.g. a lost signing key); 2 a usage or input error (every other
:class:`RvuError`, and click's own usage errors). One place maps errors to codes: :class:`RvuGroup`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rvu_pipelines.cli_adapters import adapters
from rvu_pipelines.cli_memory import memory
from rvu_pipelines.cli_recovery import RECOVERY_COMMANDS
from rvu_pipelines.cli_report import report
from rvu_pipelines.cli_scale import scale
from rvu_pipelines.errors import RvuError, SigningKeyError
from rvu_pipelines.scenarios.axes import ATTACKS, DEFENSES, NATIVE  # plain names (the package root loads no AgentDojo)

console = Console()
if not console.is_terminal:  # CI logs and pipes: wide enough that no column is clipped
    console = Console(width=200)


def exit_code(error: RvuError) -> int:
    """1 when recovery was refused (the signing key), 2 for every other usage or input error."""
    return 1 if isinstance(error, SigningKeyError) else 2


def report_error(error: RvuError) -> int:
    console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
    return exit_code(error)


class RvuGroup(click.Group):
    """Runs every subcommand with the one error policy: an RvuError prints its message (no traceback)
    and exits with :func:`exit_code`, also when the CLI is invoked in-process (tests, CliRunner)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RvuError as error:
            ctx.exit(report_error(error))


@click.group(cls=RvuGroup)
def cli() -> None:
    """RVU platform: provenance-tracked recovery and security evaluation for LLM agents."""


@cli.group()
def data() -> None:
    """Data sets."""


@data.command("check")
@click.option("--mirror", type=click.Path(), default=None, help="Mirror folder (default: RVU_DATA_MIRROR).")
def data_check(mirror: str | None) -> None:
    """List each data set with rows and sha256 status; exit 1 if a required one is unusable."""
    from rvu_pipelines.data import (
        MirrorDatasetSource,
        check_counts,
        default_dataset_source,
        load_catalog,
        load_dataset,
    )

    catalog = load_catalog()
    source = MirrorDatasetSource(Path(mirror)) if mirror else default_dataset_source()
    console.print(f"Reading data sets from {source.describe()}")
    from rvu_pipelines.data.catalog import observed_group_counts

    table = Table("data set", "rows", "published", "breakdown", "counts", "sha256", "origin")
    failures: list[str] = []
    for name, spec in sorted(catalog.datasets.items()):
        try:
            loaded = load_dataset(spec, source)
        except RvuError as exc:
            table.add_row(name, "-", str(spec.rows), "-", "-", "[red]unavailable[/red]", "-")
            failures.append(str(exc))
            continue
        problems = check_counts(spec, loaded.frame)
        verified = all(loaded.resolved.verified.values())
        breakdown = "; ".join(
            "/".join(group.by)
            + ": "
            + " / ".join(f"{key} {count}" for key, count in observed_group_counts(loaded.frame, group.by).items())
            for group in spec.group_counts
        )
        breakdown += "; ".join(f"{loaded.frame[c].n_unique()} distinct {c}" for c in spec.distinct_counts)
        table.add_row(
            name,
            str(loaded.frame.height),
            str(spec.rows),
            breakdown,
            "[green]ok[/green]" if not problems else f"[red]{'; '.join(map(str, problems))}[/red]",
            "[green]verified[/green]" if verified else "[yellow]recorded (derived from upstream)[/yellow]",
            loaded.resolved.origin.split(":", 1)[0],
        )
        if problems and spec.required:
            failures.append(f"{name}: published counts differ: {'; '.join(map(str, problems))}")
    console.print(table)
    for failure in failures:
        console.print(f"[red]✗[/red] {failure}")
    if failures:
        sys.exit(1)
    console.print(f"[green]All {len(catalog.datasets)} data sets present with their published counts.[/green]")


@cli.group()
def models() -> None:
    """Models."""


@models.command("check")
@click.option(
    "--profile",
    default=None,
    help="Model profile from configs/models.yaml (default: RVU_MODEL_PROFILE or the file's default).",
)
def models_check(profile: str | None) -> None:
    """Resolve and load each model of a profile; print its source, sha256 and one line of real output."""
    from rvu_pipelines.models import LlamaCppChatModel, ModelStore, load_model_config
    from rvu_pipelines.models.embedder import SentenceEmbedder
    from rvu_pipelines.smoke import run_embedder_smoke, run_llm_smoke

    config = load_model_config()
    specs = config.profile(profile)
    console.print(f"Profile [bold]{config.profile_name(profile)}[/bold]")
    store = ModelStore()
    for role, spec in specs.items():
        resolved = store.resolve(role, spec)
        pin = "pinned" if resolved.pinned else f"[yellow]UNPINNED - add sha256: {resolved.sha256}[/yellow]"
        console.print(
            f"[bold]{role}[/bold]: {resolved.name}\n  source  {resolved.source}\n  file    {resolved.path}"
            f"\n  size    {resolved.size_bytes / 1e6:.1f} MB\n  sha256  {resolved.sha256} ({pin})"
        )
        if role == "llm":
            result = run_llm_smoke(LlamaCppChatModel(resolved.path, n_ctx=resolved.n_ctx), max_tokens=48)
            first = result.first
            console.print(f"  output  {first.text.strip().splitlines()[0] if first.text.strip() else '(empty)'!r}")
            console.print(
                f"  speed   prompt {first.prompt_tokens_per_s:.0f} tok/s, generation "
                f"{first.generation_tokens_per_s:.0f} tok/s; deterministic={result.deterministic}"
            )
        else:
            smoke = run_embedder_smoke(SentenceEmbedder(resolved.path))
            console.print(
                f"  output  dim={smoke.dimension}, cos(paraphrase)={smoke.paraphrase_cosine:.3f}, "
                f"cos(unrelated)={smoke.unrelated_cosine:.3f}, {smoke.sentences_per_s:.0f} sentences/s"
            )


@cli.command()
@click.option("--profile", default=None, help="Model profile (default: RVU_MODEL_PROFILE or the file's default).")
@click.option(
    "--golden",
    type=click.Path(dir_okay=False),
    default=None,
    help="Golden file (default: configs/golden/table1_<profile>.json).",
)
@click.option(
    "--update-golden", is_flag=True, help="Write the current results as the golden file instead of comparing."
)
@click.option(
    "--detector",
    default="production",
    show_default=True,
    help="Classifier defense's detector: production (rvu-injection-detector@production, registered by "
    "`make run`) or any name `rvu detectors` lists (nanoguard, heuristic, registered:<name>[@<alias>], ...).",
)
@click.option(
    "--defense",
    "defenses",
    multiple=True,
    type=click.Choice(DEFENSES),
    help="Only these defenses' cells (repeatable): compared against their golden cells, or with "
    "--update-golden written into the golden file beside the others, which stay as they are. Default: all.",
)
@click.option(
    "--attack",
    "attacks",
    multiple=True,
    type=click.Choice(ATTACKS),
    help="The attacks to run each defense under (repeatable), compared against their golden cells; with "
    "--update-golden their cells are written beside the others, which stay as they are (without --attack and "
    "--defense the whole file is rewritten with the native cells). Default: native.",
)
def regress(
    profile: str | None,
    golden: str | None,
    update_golden: bool,
    detector: str,
    defenses: tuple[str, ...],
    attacks: tuple[str, ...],
) -> None:
    """Run the canonical attack cells (Table 1) and compare them with the golden results, as the nightly
    schedule does: exit 0 within tolerance (n exact, errors, ASR, utility), 1 with the diff otherwise.
    Every episode is re-run against the current code; identical prompts come from the LLM response cache."""
    from rvu_pipelines.agents.evaluation import attack_table, table_markdown
    from rvu_pipelines.agents.harness import AGENT_N_CTX, Harness
    from rvu_pipelines.agents.regression import (
        compare_to_golden,
        drift_markdown,
        golden_path,
        golden_subset,
        load_golden,
        load_tolerance,
        regression_sweep,
        write_golden,
    )
    from rvu_pipelines.code_version import code_version
    from rvu_pipelines.models import LlamaCppChatModel, ModelStore, load_model_config

    config = load_model_config()
    name = config.profile_name(profile)
    resolved = ModelStore().resolve("llm", config.profile(profile)["llm"])

    def build() -> LlamaCppChatModel:  # only when a prompt misses the response cache
        return LlamaCppChatModel(
            resolved.path, n_ctx=max(AGENT_N_CTX, resolved.n_ctx), name=resolved.name, model_sha256=resolved.sha256
        )

    harness = Harness.open(
        (build, resolved.name), profile=name, model_id=resolved.sha256, detector=detector, gguf_path=resolved.path
    )
    runs = regression_sweep(harness, defenses or DEFENSES, attacks=attacks or (NATIVE,))
    table = attack_table(runs)
    console.print(table_markdown(table), highlight=False, soft_wrap=True)
    inferences = sum(run.llm_inferences for run in runs)
    episodes = sum(run.new_episodes for run in runs)
    console.print(
        f"Code version {code_version()}: {episodes} episodes re-run, {inferences} LLM inferences "
        "(the rest of the calls came from the response cache)"
    )
    path = Path(golden) if golden else golden_path(name)
    if update_golden:
        written = write_golden(table, name, resolved.sha256, path, only=defenses or None, attacks=attacks or None)
        chosen = [*defenses, *attacks]
        console.print(f"Golden results written to {written}" + (f" (cells of {', '.join(chosen)})" if chosen else ""))
        return
    expected = golden_subset(load_golden(path), defenses or None, attacks or (NATIVE,))
    drifts = compare_to_golden(table, expected, load_tolerance())
    console.print(drift_markdown(drifts), highlight=False, soft_wrap=True)
    if drifts:
        console.print(f"[red]{len(drifts)} metric(s) moved beyond tolerance against {path}[/red]")
        sys.exit(1)
    console.print(f"[green]Within tolerance of {path}[/green]")


@cli.command()
@click.option("--all", "show_all", is_flag=True, help="Every metric of every recent run instead of the headlines.")
def summary(show_all: bool) -> None:
    """Did each domain run, its headline metrics against their goals, and where to look (Dagster UI, MLflow UI)."""
    from rvu_pipelines.paths import state_dir
    from rvu_pipelines.tracking import MlflowTracker

    if not show_all:
        from rvu_pipelines.run_summary import build_rows, summary_table

        tracker, state = MlflowTracker(), state_dir()
        where = f"MLflow {escape(tracker.tracking_uri)}; outputs in {escape(str(state))}"
        console.print(f"[bold]Last runs by domain[/bold] ({where})")
        console.print(summary_table(build_rows(tracker, state)))
        console.print(
            "Where to look:\n"
            "  Dagster UI  make dev        -> http://127.0.0.1:3000 (assets, every check, lineage, runs)\n"
            "  MLflow UI   make mlflow-ui  -> http://127.0.0.1:5000 (experiments above; all metrics: rvu summary --all)"
        )
        return
    outputs = sorted((state_dir() / "assets").glob("**/*.*"))
    console.print(f"[bold]Asset outputs[/bold] ({len(outputs)}) in {state_dir() / 'assets'}")
    tracker = MlflowTracker()
    experiments = {e.experiment_id: e.name for e in tracker.project_experiments()}
    table = Table("MLflow run", "experiment", "asset", "status", "metrics")
    seen: set[str] = set()
    for run in tracker.latest_project_runs(max_results=200):
        name = run.data.tags.get("asset_key", run.info.run_name)
        if name in seen:
            continue
        seen.add(name)
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(run.data.metrics.items()))
        table.add_row(run.info.run_id[:8], experiments.get(run.info.experiment_id, "?"), name, run.info.status, metrics)
    console.print(table)
    console.print(
        "Where to look:\n"
        "  Dagster UI  make dev        -> http://127.0.0.1:3000 (assets, checks, lineage, runs)\n"
        f"  MLflow UI   make mlflow-ui  -> http://127.0.0.1:5000 (tracking store {tracker.tracking_uri})"
    )


@cli.command("detectors")
def detectors_command() -> None:
    """The detectors a --detector option (and an asset's detector config) accepts, with what each is."""
    from rich.markup import escape

    from rvu_pipelines.detectors.catalog import plugins

    for plugin in plugins():
        console.print(
            f"[bold]{escape(plugin.choice)}[/bold]  {escape(plugin.summary)}", highlight=False, soft_wrap=True
        )


@cli.command("settings")
@click.option("--markdown", is_flag=True, help="Print the reference table README shows instead of current values.")
def settings_command(markdown: bool) -> None:
    """Every environment variable the platform reads, its group, default and current value."""
    import os

    from rvu_pipelines.settings import SETTINGS, markdown_table

    if markdown:
        click.echo(markdown_table())
        return
    table = Table("variable", "group", "current", "default", "what it does")
    for setting in SETTINGS:
        current = os.environ.get(setting.name)
        table.add_row(
            setting.name,
            setting.group,
            current if current is not None else "[dim]unset[/dim]",
            setting.default or "-",
            setting.help,
        )
    console.print(table)


@cli.command()
@click.option("--no-generation", is_flag=True, help="Skip the child-process generation (the slowest check).")
def doctor(no_generation: bool) -> None:
    """Check this machine: CPU features, llama.cpp build and settings, torch, model files and sha256, one
    generation in a child process, MLflow and Dagster home. Exit 1 naming every failed check."""
    from rvu_pipelines.doctor import run_checks

    with console.status("checking") as status:
        checks = run_checks(generation=not no_generation, progress=lambda name: status.update(f"checking {name}"))
    for check in checks:
        mark = "[red]✗[/red]" if not check.passed else ("[yellow]![/yellow]" if check.advisory else "[green]✓[/green]")
        lines = check.detail.splitlines() or [""]
        console.print(f"{mark} [bold]{check.name}[/bold]: {lines[0]}", highlight=False, soft_wrap=True)
        for line in lines[1:]:
            console.print(f"    {line}", highlight=False, soft_wrap=True)
    failed = [check.name for check in checks if not check.passed]
    if failed:
        console.print(f"[red]doctor: {len(failed)} check(s) failed: {', '.join(failed)}[/red]")
        sys.exit(1)
    console.print(f"[green]doctor: all {len(checks)} checks passed[/green]")


for command in RECOVERY_COMMANDS:
    cli.add_command(command)
cli.add_command(scale)
cli.add_command(adapters)
cli.add_command(memory)
cli.add_command(report)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except RvuError as exc:  # raised outside a subcommand (RvuGroup handles those)
        sys.exit(report_error(exc))


if __name__ == "__main__":
    main()
