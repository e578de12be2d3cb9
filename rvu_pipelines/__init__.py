"""RVU platform domain library: plain Python, no Dagster (see rvu_pipelines/definitions.py)."""

__version__ = "0.1.0"
