"""The scale-out profile: real engines instead of the embedded ones (PostgreSQL, MLflow, Dagster, celery)."""
