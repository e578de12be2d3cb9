"""Dagster assets and asset checks, one module per domain; each is a thin call into rvu_pipelines."""
