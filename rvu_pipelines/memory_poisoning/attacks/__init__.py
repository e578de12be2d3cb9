"""Memory-poisoning attacks, by escalating access (the paper's three classes) and the adaptive ones."""

from rvu_pipelines.memory_poisoning.attacks.base import AttackRun

__all__ = ["AttackRun"]
