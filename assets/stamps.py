"""What a study asset's stamped results name as the command that produced them."""

import json

from dagster import AssetExecutionContext, Config


def launched_command(context: AssetExecutionContext, config: Config) -> str:
    """The job, the asset and the config fields set away from their defaults (what reproduces the run)."""
    chosen = json.dumps(config.model_dump(exclude_defaults=True), sort_keys=True)
    return f"dg launch --job {context.run.job_name} (asset {context.asset_key.to_user_string()}, config {chosen})"
