"""Write-time detectors for memory poisoning: MEMSAD, the paper's baselines, two more, composites, hybrid.

Import the LLM-backed perplexity scorer from ``defenses.perplexity`` (it loads llama.cpp lazily).
"""

from rvu_pipelines.memory_poisoning.defenses.base import WriteContext, WriteDetector
from rvu_pipelines.memory_poisoning.defenses.baselines import (
    BASELINES,
    EnergyDetector,
    KnnDetector,
    MahalanobisDetector,
    SpectralSignatureDetector,
    TrustRagFilter,
)
from rvu_pipelines.memory_poisoning.defenses.composite import COMPOSITE_KAPPA, CompositeDetector, composite_defense
from rvu_pipelines.memory_poisoning.defenses.hybrid import HybridDetector, wordpiece_tokenizer
from rvu_pipelines.memory_poisoning.defenses.memsad import (
    DEFAULT_KAPPA,
    Calibration,
    MemsadDetector,
    WindowEstimate,
    calibrate,
    combined_scores,
    estimate_window,
    minimum_calibration_size,
    optimal_window,
)

__all__ = [
    "BASELINES",
    "COMPOSITE_KAPPA",
    "DEFAULT_KAPPA",
    "Calibration",
    "CompositeDetector",
    "EnergyDetector",
    "HybridDetector",
    "KnnDetector",
    "MahalanobisDetector",
    "MemsadDetector",
    "SpectralSignatureDetector",
    "TrustRagFilter",
    "WindowEstimate",
    "WriteContext",
    "WriteDetector",
    "calibrate",
    "combined_scores",
    "composite_defense",
    "estimate_window",
    "minimum_calibration_size",
    "optimal_window",
    "wordpiece_tokenizer",
]
