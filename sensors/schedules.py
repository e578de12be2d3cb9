"""The nightly regression sweep: the canonical attack cells at 02:00, compared with the golden results, and a
fixed-seed sample of every benchmark under every defense.

Every episode is re-run against the current code (config ``rerun``; the job's tag ``rvu/sweep=nightly``
forces it too), so a broken defense or judge shows up the next morning instead of stored rows being
replayed; the LLM response cache still serves identical prompts, which keeps the sweep cheap.
"""

from dagster import ScheduleDefinition

from assets.attacks import nightly_regression_job

NIGHTLY_RUN_CONFIG = {
    "ops": {name: {"config": {"rerun": True}} for name in ("attack_table_1", "attack_benchmark_samples")}
}

nightly_regression_schedule = ScheduleDefinition(
    name="nightly_regression_sweep",
    job=nightly_regression_job,
    cron_schedule="0 2 * * *",
    execution_timezone="UTC",
    run_config=NIGHTLY_RUN_CONFIG,
    description="02:00 UTC every night: Table 1 on the default profile, every episode re-run against the "
    "current code, against the golden results (n, errors, ASR, utility); and the benchmark samples.",
)
