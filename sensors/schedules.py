"""The nightly regression sweep: the canonical attack cells at 02:00, compared with the golden results."""

from dagster import AssetSelection, ScheduleDefinition, define_asset_job, in_process_executor

nightly_regression_job = define_asset_job(
    "nightly_regression_job",
    selection=AssetSelection.assets("attack_table_1"),
    executor_def=in_process_executor,
    tags={"rvu/sweep": "nightly"},
    description="Re-run the canonical attack cells (Table 1) and check them against configs/golden/ "
    "(tolerances in configs/regression.yaml). MLflow runs carry the tag rvu_sweep=nightly.",
)

nightly_regression_schedule = ScheduleDefinition(
    name="nightly_regression_sweep",
    job=nightly_regression_job,
    cron_schedule="0 2 * * *",
    execution_timezone="UTC",
    description="02:00 UTC every night: Table 1 on the default profile against the golden results.",
)
