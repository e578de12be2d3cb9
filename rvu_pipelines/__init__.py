"""RVU platform domain library: plain Python, no Dagster (the code location is assets/definitions.py)."""

__version__ = "0.1.0"
