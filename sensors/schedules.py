"""The nightly regression sweep: the canonical attack cells at 02:00, compared with the golden results."""

from dagster import ScheduleDefinition

from assets.jobs import nightly_regression_job

nightly_regression_schedule = ScheduleDefinition(
    name="nightly_regression_sweep",
    job=nightly_regression_job,
    cron_schedule="0 2 * * *",
    execution_timezone="UTC",
    description="02:00 UTC every night: Table 1 on the default profile against the golden results.",
)
