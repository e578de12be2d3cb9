"""The `rvu` command: check data and models, and summarise what the last runs produced.

User-caused problems (missing data, wrong checksum, bad config) print one clear message and exit
non-zero; a traceback is never the only thing a user sees.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from rvu_pipelines.errors import RvuError

console = Console()
if not console.is_terminal:  # CI logs and pipes: wide enough that no column is clipped
    console = Console(width=200)


@click.group()
def cli() -> None:
    """RVU platform: provenance-tracked recovery and security evaluation for LLM agents."""


@cli.group()
def data() -> None:
    """Data sets."""


@data.command("check")
@click.option("--mirror", type=click.Path(), default=None, help="Mirror folder (default: RVU_DATA_MIRROR).")
def data_check(mirror: str | None) -> None:
    """List each data set with rows and sha256 status; exit 1 if a required one is unusable."""
    from rvu_pipelines.data import MirrorDatasetSource, check_counts, dataset_source_from_env, load_catalog, load_dataset

    catalog = load_catalog()
    source = MirrorDatasetSource(Path(mirror)) if mirror else dataset_source_from_env()
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
            "/".join(group.by) + ": "
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
@click.option("--profile", default=None, help="Model profile from configs/models.yaml (default: RVU_MODEL_PROFILE or the file's default).")
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
        console.print(f"[bold]{role}[/bold]: {resolved.name}\n  source  {resolved.source}\n  file    {resolved.path}"
                      f"\n  size    {resolved.size_bytes / 1e6:.1f} MB\n  sha256  {resolved.sha256} ({pin})")
        if role == "llm":
            result = run_llm_smoke(LlamaCppChatModel(resolved.path, n_ctx=resolved.n_ctx), max_tokens=48)
            first = result.first
            console.print(f"  output  {first.text.strip().splitlines()[0] if first.text.strip() else '(empty)'!r}")
            console.print(f"  speed   prompt {first.prompt_tokens_per_s:.0f} tok/s, generation "
                          f"{first.generation_tokens_per_s:.0f} tok/s; deterministic={result.deterministic}")
        else:
            smoke = run_embedder_smoke(SentenceEmbedder(resolved.path))
            console.print(f"  output  dim={smoke.dimension}, cos(paraphrase)={smoke.paraphrase_cosine:.3f}, "
                          f"cos(unrelated)={smoke.unrelated_cosine:.3f}, {smoke.sentences_per_s:.0f} sentences/s")


@cli.command()
def summary() -> None:
    """What the last runs produced and where to look (Dagster UI, MLflow UI, files)."""
    from rvu_pipelines.paths import state_dir
    from rvu_pipelines.tracking import MlflowTracker

    outputs = sorted((state_dir() / "assets").glob("**/*.*"))
    console.print(f"[bold]Asset outputs[/bold] ({len(outputs)}) in {state_dir() / 'assets'}")
    tracker = MlflowTracker()
    table = Table("MLflow run", "asset", "status", "metrics")
    seen: set[str] = set()
    for run in tracker.latest_runs(max_results=50):
        name = run.data.tags.get("asset_key", run.info.run_name)
        if name in seen:
            continue
        seen.add(name)
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(run.data.metrics.items()))
        table.add_row(run.info.run_id[:8], name, run.info.status, metrics)
    console.print(table)
    console.print(
        "Where to look:\n"
        "  Dagster UI  make dev        -> http://127.0.0.1:3000 (assets, checks, lineage, runs)\n"
        f"  MLflow UI   make mlflow-ui  -> http://127.0.0.1:5000 (tracking store {tracker.tracking_uri})"
    )


def main() -> None:
    try:
        cli(standalone_mode=True)
    except RvuError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
