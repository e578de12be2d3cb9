"""Sensors (incident logs) and schedules (nightly regression)."""

from sensors.incidents import incident_log_sensor
from sensors.schedules import nightly_regression_schedule

SENSORS = [incident_log_sensor]
SCHEDULES = [nightly_regression_schedule]
