"""Sensors (incident logs) and schedules (nightly regression)."""

from sensors.incidents import incident_log_sensor, recovery_job
from sensors.schedules import nightly_regression_job, nightly_regression_schedule

SENSORS = [incident_log_sensor]
SCHEDULES = [nightly_regression_schedule]
JOBS = [recovery_job, nightly_regression_job]
