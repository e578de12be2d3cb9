from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from dagster import AssetExecutionContext, ConfigurableResource
from pydantic import Field

from rvu_pipelines.tracking import MlflowTracker, TrackedRun, experiment_for


class MlflowTrackerResource(ConfigurableResource):
    """One MLflow run per asset materialization, tagged with the Dagster run, asset and partition.

    Our own thin resource rather than dagster-mlflow's end-of-run hook, which closes runs early
    (dagster issue 21872).
    """

    tracking_uri: str | None = Field(default=None, description="Default: MLFLOW_TRACKING_URI, else SQLite in .rvu/")
    experiment: str | None = Field(
        default=None,
        description="One experiment for every run; default: one per "
        "domain, from the asset's group (rvu-attacks, rvu-recovery, ...)",
    )

    def tracker(self, group: str | None = None) -> MlflowTracker:
        return MlflowTracker(self.tracking_uri, self.experiment or experiment_for(group))

    @contextmanager
    def run_for(
        self,
        context: AssetExecutionContext,
        params: Mapping[str, object] | None = None,
        *,
        name: str | None = None,
        tags: Mapping[str, object] | None = None,
    ) -> Iterator[TrackedRun]:
        """``name``/``tags``: for assets that log several runs (one per attack-table cell)."""
        keys = sorted(key.to_user_string() for key in context.selected_asset_keys)
        asset_key = keys[0] if len(keys) == 1 else context.op_execution_context.op.name  # multi-assets: the op
        all_tags = {
            "dagster_run_id": context.run.run_id,
            "dagster_job": context.run.job_name,
            "asset_key": asset_key,
            "asset_keys": ",".join(keys),
            "partition": context.partition_key if context.has_partition_key else "",
            **{k.replace("/", "_"): v for k, v in sorted(context.run.tags.items()) if k.startswith("rvu/")},
            **(tags or {}),
        }
        groups = context.assets_def.group_names_by_key
        group = next((groups[key] for key in sorted(context.selected_asset_keys) if key in groups), None)
        with self.tracker(group).run(name or asset_key, tags=all_tags, params=params) as run:
            yield run
