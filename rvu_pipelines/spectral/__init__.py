"""Seed 004: the spectral kill switch (HFER and spectral entropy of attention token graphs).

``graph`` holds the pure graph-signal maths, ``model`` the one-forward-pass extraction from the agent's own
weights, ``uncertainty`` the bootstrap, ``killswitch`` the calibrated threshold, ``data`` the real data sets.
"""

from rvu_pipelines.spectral.config import (
    DEFAULT_GRAPH_CONFIG,
    GRAPH_CONFIGS,
    GraphConfig,
    config_statistic,
    config_stats,
    graph_config,
    per_head_stats,
    prepare_signal,
    sink_positions,
)
from rvu_pipelines.spectral.errors import (
    CalibrationError,
    ContextLengthError,
    LayerIndexError,
    NoAttentionError,
    SpectralError,
    SpectralInputError,
)
from rvu_pipelines.spectral.fast import fast_fiedler, fast_spectral_stats
from rvu_pipelines.spectral.graph import (
    DEFAULT_CUTOFF_RATIO,
    STAT_NAMES,
    SpectralStats,
    attention_adjacency,
    graph_fourier_basis,
    high_band,
    kept_modes,
    laplacian,
    spectral_energy,
    spectral_stats,
)
from rvu_pipelines.spectral.model import (
    ForwardTrace,
    SpectralModel,
    head_stats_from_trace,
    layer_stats_from_trace,
    load_profile_model,
    load_spectral_model,
)

__all__ = [
    "DEFAULT_CUTOFF_RATIO",
    "DEFAULT_GRAPH_CONFIG",
    "GRAPH_CONFIGS",
    "GraphConfig",
    "config_statistic",
    "config_stats",
    "fast_fiedler",
    "fast_spectral_stats",
    "graph_config",
    "head_stats_from_trace",
    "kept_modes",
    "per_head_stats",
    "prepare_signal",
    "sink_positions",
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
