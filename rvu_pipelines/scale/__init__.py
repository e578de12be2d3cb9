"""The scale-out profile (issue 16): real engines instead of the embedded ones — a local PostgreSQL server today."""
