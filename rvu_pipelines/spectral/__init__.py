"""Seed 004: the spectral kill switch (HFER and spectral entropy of attention token graphs).

``graph`` holds the pure graph-signal maths, ``model`` the one-forward-pass extraction from the agent's own
weights, ``uncertainty`` the bootstrap, ``killswitch`` the calibrated threshold, ``data`` the real data sets.
"""

from rvu_pipelines.spectral.errors import (
    CalibrationError,
    ContextLengthError,
    LayerIndexError,
    NoAttentionError,
    SpectralError,
    SpectralInputError,
)
from rvu_pipelines.spectral.graph import (
    DEFAULT_CUTOFF_RATIO,
    STAT_NAMES,
    SpectralStats,
    attention_adjacency,
    graph_fourier_basis,
    high_band,
    laplacian,
    spectral_energy,
    spectral_stats,
)
from rvu_pipelines.spectral.model import (
    ForwardTrace,
    SpectralModel,
    layer_stats_from_trace,
    load_profile_model,
    load_spectral_model,
)

__all__ = [
    "DEFAULT_CUTOFF_RATIO",
    "STAT_NAMES",
    "CalibrationError",
    "ContextLengthError",
    "ForwardTrace",
    "LayerIndexError",
    "NoAttentionError",
    "SpectralError",
    "SpectralInputError",
    "SpectralModel",
    "SpectralStats",
    "attention_adjacency",
    "graph_fourier_basis",
    "high_band",
    "laplacian",
    "layer_stats_from_trace",
    "load_profile_model",
    "load_spectral_model",
    "spectral_energy",
    "spectral_stats",
]
