"""Prompt-injection detectors D1-D5 (seed 002 §5): corpora, models, metrics, registry."""
