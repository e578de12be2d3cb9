"""Sensors (incident logs) and schedules (nightly regression)."""

from sensors.incidents import incident_log_sensor, recovery_job

SENSORS = [incident_log_sensor]
SCHEDULES: list = []
JOBS = [recovery_job]
