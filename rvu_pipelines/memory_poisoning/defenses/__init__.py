"""Write-time detectors for memory poisoning: MEMSAD, the paper's baselines, two more, composites, hybrid."""

from rvu_pipelines.memory_poisoning.defenses.base import WriteContext, WriteDetector

__all__ = ["WriteContext", "WriteDetector"]
