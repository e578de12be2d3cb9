"""Sensors (incident logs) and schedules (nightly regression); added by the recovery and harness work."""

SENSORS: list = []
SCHEDULES: list = []
