"""What every full-study asset does around its library run: the MLflow run and thread limit, a refusal of the
library as the asset's Failure, the tables as artifacts, the command its stamped results name."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext, Config, Failure, MetadataValue

from resources import MlflowTrackerResource
from rvu_pipelines.machine import thread_limit


def launched_command(context: AssetExecutionContext, config: Config | None = None) -> str:
    """What reruns this step, as a command that runs as written: the job, or the asset alone when it was launched
    alone (``dg launch --assets``, Dagster's implicit job), with the config fields set away from their defaults."""
    job = context.run.job_name
    asset = context.asset_key.to_user_string()
    command = f"dg launch --assets {asset}" if job.startswith("__") else f"dg launch --job {job}"
    chosen = config.model_dump(exclude_defaults=True) if config is not None else {}
    if chosen:
        command += " --config-json '" + json.dumps({"ops": {asset: {"config": chosen}}}, sort_keys=True) + "'"
    return command


def run_full_study(
    context: AssetExecutionContext,
    mlflow_tracker: MlflowTrackerResource,
    config: Config,
    compute: Callable[[], Any],
    *,
    out: Path,
    page: str,
    artifacts: tuple[str, ...],
    metrics: Callable[[Any], dict[str, float]],
    threads: int | None = None,
    refusals: tuple[type[Exception], ...] = (ValueError,),
) -> tuple[Any, dict[str, Any]]:
    """``compute`` inside the asset's MLflow run (params: the config) and thread limit; one of ``refusals`` becomes
    the asset's Failure naming the asset; the files ``artifacts`` (relative to ``out``) that exist are logged.
    Returns the result and the asset's metadata, with ``page`` (a markdown file under ``out``) shown."""
    with thread_limit(threads), mlflow_tracker.run_for(context, params=config.model_dump()) as run:
        try:
            result = compute()
        except refusals as exc:
            raise Failure(description=f"{context.asset_key.to_user_string()}: {exc}") from exc
        run.log_metrics(metrics(result))
        for name in artifacts:  # a file in a subfolder of ``out`` keeps that folder in the run's artifacts
            if (out / name).is_file():
                folder = Path(name).parent
                run.log_artifact(out / name, artifact_path=None if folder == Path(".") else str(folder))
    shown = out / page
    metadata = {
        "folder": str(out),
        page: MetadataValue.md(shown.read_text(encoding="utf-8")) if shown.is_file() else "",
        "mlflow_run_id": run.run_id,
    }
    return result, metadata
