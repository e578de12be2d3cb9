"""Named graph/signal configurations: which token graph, which signal, which Laplacian, how many modes.

Why this exists: with the raw head-mean graph the statistic reads the *attention sink*. Token 0 (and, at
some layers, a few other positions every later token attends to) holds most of the hidden-state energy
and most of the graph's degree, so HFER and spectral entropy flip from layer to layer with the sink's own
eigenvector weight, whatever the text says. A configuration states the remedy (or its absence) once:

* ``"seed_study"``: the statistic as first specified (``graph.spectral_stats`` defaults): combinatorial
  Laplacian of the head mean, raw hidden states, sinks kept, every eigenpair. Kept for comparability.
* ``"sink_free"`` (recommended): sinks removed before the Laplacian (token 0 always, plus any position the
  later tokens attend to heavily), the mean token vector subtracted over the kept tokens (the shared
  direction every token carries is a graph-independent DC term, not a frequency), and the symmetric
  normalised Laplacian, whose spectrum lies in [0, 2] whatever the degrees: a hub's degree no longer
  sets the top of the spectrum, so the 10 % cut-off compares like with like across layers and lengths.
* ``"sink_free_norm"``: ``sink_free`` plus the *norm* rule: a token whose hidden state at the layer is a
  massive activation (raw L2 norm at least ``sink_norm_factor`` times the median of the other tokens) is
  dropped too. Such a token (a "the" deep in the text, say) can hold a third of the centred energy at the
  early layers without being attended to, so the attention rule alone keeps it.
* ``"spectral_trust"``: the author's public pipeline as its code states it. Symmetrised attention,
  uniform head mean, self-loops kept (vcnoel/spectral-trust src/spectral_trust/graph.py:
  ``symmetrize_attention``, ``aggregate_heads``, ``construct_laplacian``); random-walk Laplacian
  ``I − D⁻¹W`` (``normalization="rw"``), 50 eigenpairs, cut-off ratio 0.1 (src/spectral_trust/config.py);
  signal ``hidden_states[ℓ + 1]`` raw, no sink handling (src/spectral_trust/framework.py
  ``analyze_text``); for more than 50 tokens the 25 smallest and 25 largest eigenpairs, energies, HFER
  and entropy over those 50 modes only, smoothness ``tr(XᵀLX)/tr(XᵀX)`` on the full Laplacian, Fiedler
  ``eigenvalues[1]`` (src/spectral_trust/spectral.py ``compute_eigendecomposition``, ``compute_hfer``,
  ``compute_spectral_entropy``, ``compute_smoothness_index``). Where the replica departs, deliberately:
  that code hands the non-symmetric ``I − D⁻¹W`` to symmetric solvers (ARPACK ``eigsh`` from a random
  start, or ``scipy.linalg.eigh``, which reads one triangle), so its eigenpairs are not those of the
  matrix and are not reproducible; here the eigenvalues are the exact ones (those of ``L_sym``) and the
  signal is expanded in the D-orthonormal eigenbasis (``graph`` module docstring), which also makes the
  smoothness the D-norm Rayleigh quotient. The entropy is reported in nats (``spectral_entropy_nats``, as
  the author does) and normalised by ``log 50``; the cut-off keeps eigenspaces whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from rvu_pipelines.spectral.errors import SpectralInputError
from rvu_pipelines.spectral.fast import fast_spectral_stats, symmetric_fiedler
from rvu_pipelines.spectral.graph import (
    DEFAULT_CUTOFF_RATIO,
    LAPLACIANS,
    STAT_NAMES,
    LaplacianKind,
    SpectralStats,
    attention_adjacency,
    spectral_stats,
)

SignalKind = Literal["raw", "centred", "normalised"]
Method = Literal["exact", "fast"]
METHODS: tuple[str, ...] = ("exact", "fast")
SIGNALS: tuple[str, ...] = ("raw", "centred", "normalised")
DEFAULT_SINK_THRESHOLD = 0.1
DEFAULT_SINK_MIN_FOLLOWERS = 8
DEFAULT_SINK_NORM_FACTOR = 4.0


@dataclass(frozen=True)
class GraphConfig:
    """How one layer's token graph and graph signal are built from attention and hidden states.

    ``laplacian``: see ``graph.laplacian``. ``exclude_sinks``: drop ``sink_positions`` (token 0 always)
    from both graph and signal before the Laplacian (the induced subgraph). ``sink_threshold``: a position
    is a sink when the head-mean attention it receives, averaged over the positions after it, is at least
    this; only positions with at least ``sink_min_followers`` later tokens qualify (the last few tokens
    get heavy *recency* attention from their one or two successors, which is locality, not a sink).
    ``sink_norm_factor``: also drop every position whose raw hidden-state norm is at least this many times
    the median norm of the positions the attention rule keeps (``None``: attention rule only).
    ``signal``: ``"raw"`` hidden states; ``"centred"`` minus the mean kept-token vector; ``"normalised"``
    centred, then every token's vector scaled to unit L2 norm (a zero vector stays zero), so each token
    weighs the same. ``eigenpairs``: ``None`` for every mode, else ``graph.kept_modes``. The graph is the
    head mean; ``per_head_stats`` gives one graph per head on the same kept tokens and signal.
    """

    laplacian: LaplacianKind = "combinatorial"
    exclude_sinks: bool = False
    sink_threshold: float = DEFAULT_SINK_THRESHOLD
    sink_min_followers: int = DEFAULT_SINK_MIN_FOLLOWERS
    sink_norm_factor: float | None = None
    signal: SignalKind = "raw"
    eigenpairs: int | None = None
    cutoff_ratio: float = DEFAULT_CUTOFF_RATIO

    def __post_init__(self) -> None:
        if self.laplacian not in LAPLACIANS:
            raise SpectralInputError(f"Unknown Laplacian '{self.laplacian}'. Allowed values: {list(LAPLACIANS)}")
        if self.signal not in SIGNALS:
            raise SpectralInputError(f"Unknown signal '{self.signal}'. Allowed values: {list(SIGNALS)}")
        factor = self.sink_norm_factor
        if factor is not None and not (np.isfinite(factor) and factor > 1.0):
            raise SpectralInputError(
                f"sink_norm_factor must be None or a finite number above 1; got {self.sink_norm_factor}."
            )
        if self.sink_norm_factor is not None and not self.exclude_sinks:
            raise SpectralInputError("sink_norm_factor needs exclude_sinks=True (it names sinks to exclude).")
        if not 0.0 < self.sink_threshold <= 1.0:
            raise SpectralInputError(f"sink_threshold must lie in (0, 1]; got {self.sink_threshold}.")
        if self.sink_min_followers < 1:
            raise SpectralInputError(f"sink_min_followers must be at least 1; got {self.sink_min_followers}.")
        if self.eigenpairs is not None and self.eigenpairs < 2:
            raise SpectralInputError(f"eigenpairs must be None (all) or at least 2; got {self.eigenpairs}.")
        if not 0.0 < self.cutoff_ratio < 1.0:
            raise SpectralInputError(f"cutoff_ratio must lie strictly between 0 and 1; got {self.cutoff_ratio}.")


GRAPH_CONFIGS: dict[str, GraphConfig] = {
    "seed_study": GraphConfig(),
    "sink_free": GraphConfig(laplacian="normalized", exclude_sinks=True, signal="centred"),
    "sink_free_norm": GraphConfig(
        laplacian="normalized", exclude_sinks=True, signal="centred", sink_norm_factor=DEFAULT_SINK_NORM_FACTOR
    ),
    "spectral_trust": GraphConfig(laplacian="random_walk", eigenpairs=50),
}
DEFAULT_GRAPH_CONFIG = "sink_free"


def graph_config(name: str) -> GraphConfig:
    """The registered configuration called ``name``."""
    try:
        return GRAPH_CONFIGS[name]
    except KeyError:
        raise SpectralInputError(
            f"Unknown graph configuration '{name}'. Allowed values: {sorted(GRAPH_CONFIGS)}"
        ) from None


def head_mean(attention: np.ndarray) -> np.ndarray:
    """Heads × N × N (or N × N) attention as one float64 N × N matrix, checked."""
    a = np.asarray(attention)
    if a.ndim == 3:
        a = a.mean(axis=0, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise SpectralInputError(f"Attention must be heads × N × N or N × N with N ≥ 1; got shape {a.shape}.")
    return a


def sink_positions(
    attention: np.ndarray,
    threshold: float = DEFAULT_SINK_THRESHOLD,
    *,
    min_followers: int = DEFAULT_SINK_MIN_FOLLOWERS,
) -> np.ndarray:
    """Sorted positions that act as attention sinks: token 0 always, plus every position j with at least
    ``min_followers`` later tokens whose mean received attention ``mean_{i > j} Ā[i, j]`` is ≥ ``threshold``
    (``Ā`` the head mean, rows = queries)."""
    a = head_mean(attention)
    n = a.shape[0]
    followers = np.arange(n - 1, -1, -1)
    received = np.tril(a, -1).sum(axis=0) / np.maximum(followers, 1)
    sinks = (received >= threshold) & (followers >= min_followers)
    sinks[0] = True
    return np.flatnonzero(sinks)


def norm_sink_positions(signal: np.ndarray, candidates: np.ndarray, factor: float) -> np.ndarray:
    """Sorted positions among ``candidates`` whose raw hidden-state L2 norm is at least ``factor`` times the
    median norm over ``candidates`` (massive activations: a few tokens carry norms many times the rest)."""
    x = np.asarray(signal, dtype=np.float64)
    if x.ndim != 2:
        raise SpectralInputError(f"Signal must be N × d; got shape {x.shape}.")
    if candidates.size == 0:
        return candidates
    norms = np.linalg.norm(x[candidates], axis=1)
    return candidates[norms >= factor * float(np.median(norms))]


def kept_positions(
    attention: np.ndarray,
    config: GraphConfig,
    token_slice: slice | None = None,
    *,
    signal: np.ndarray | None = None,
) -> np.ndarray:
    """Token positions the graph keeps: the slice (all tokens by default) minus the sinks when excluded.
    Sinks are found on the whole text (its attention; with ``sink_norm_factor``, also its hidden states
    ``signal``, which that rule needs), so a span's statistic drops the same tokens."""
    n = np.asarray(attention).shape[-1]
    positions = np.arange(n)[token_slice or slice(None)]
    if config.exclude_sinks:
        sinks = sink_positions(attention, config.sink_threshold, min_followers=config.sink_min_followers)
        if config.sink_norm_factor is not None:
            if signal is None:
                raise SpectralInputError("The norm sink rule (sink_norm_factor) needs the layer's hidden states.")
            if np.asarray(signal).shape[0] != n:
                raise SpectralInputError(f"Signal has {np.asarray(signal).shape[0]} tokens, attention {n}.")
            others = np.setdiff1d(np.arange(n), sinks)
            sinks = np.union1d(sinks, norm_sink_positions(signal, others, config.sink_norm_factor))
        positions = np.setdiff1d(positions, sinks)
    if positions.size == 0:
        raise SpectralInputError(
            f"No token is left for the graph: slice {token_slice} of {n} tokens, sinks excluded: "
            f"{config.exclude_sinks}."
        )
    return positions


def prepare_signal(signal: np.ndarray, kind: SignalKind) -> np.ndarray:
    """The graph signal (tokens × d, float64) under ``kind`` (see ``GraphConfig``)."""
    x = np.asarray(signal, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise SpectralInputError(f"Signal must be N × d with N ≥ 1; got shape {x.shape}.")
    if not np.all(np.isfinite(x)):
        raise SpectralInputError("Signal (hidden states) holds NaN or infinite values.")
    if kind == "raw":
        return x
    centred = x - x.mean(axis=0, keepdims=True)
    if kind == "centred":
        return centred
    if kind == "normalised":
        norms = np.linalg.norm(centred, axis=1, keepdims=True)
        return np.divide(centred, norms, out=np.zeros_like(centred), where=norms > 0)
    raise SpectralInputError(f"Unknown signal '{kind}'. Allowed values: {list(SIGNALS)}")


def _checked_method(method: str) -> None:
    if method not in METHODS:
        raise SpectralInputError(f"Unknown method '{method}'. Allowed values: {list(METHODS)}")


def _graph_stats(adjacency: np.ndarray, x: np.ndarray, config: GraphConfig, method: Method) -> SpectralStats:
    if method == "fast":
        if config.eigenpairs is not None:
            raise SpectralInputError(
                f"method='fast' estimates every mode; this configuration keeps {config.eigenpairs} eigenpairs. "
                "Use method='exact'."
            )
        return fast_spectral_stats(adjacency, x, kind=config.laplacian, cutoff_ratio=config.cutoff_ratio)
    return spectral_stats(
        adjacency, x, kind=config.laplacian, cutoff_ratio=config.cutoff_ratio, eigenpairs=config.eigenpairs
    )


def config_stats(
    attention: np.ndarray,
    signal: np.ndarray,
    config: GraphConfig,
    *,
    token_slice: slice | None = None,
    method: Method = "exact",
) -> SpectralStats:
    """The head-mean graph's statistics under ``config`` (``method="fast"``: ``fast.fast_spectral_stats``)."""
    _checked_method(method)
    keep = kept_positions(attention, config, token_slice, signal=signal)
    adjacency = attention_adjacency(attention)[np.ix_(keep, keep)]
    return _graph_stats(adjacency, prepare_signal(np.asarray(signal)[keep], config.signal), config, method)


def per_head_stats(
    attention: np.ndarray,
    signal: np.ndarray,
    config: GraphConfig,
    *,
    token_slice: slice | None = None,
    method: Method = "exact",
) -> np.ndarray:
    """Heads × ``STAT_NAMES`` array: every head's own symmetrised graph on the same kept tokens (sinks from
    the head mean, so the rows of different heads describe the same tokens) and the same signal."""
    _checked_method(method)
    a = np.asarray(attention)
    if a.ndim != 3:
        raise SpectralInputError(f"Per-head statistics need heads × N × N attention; got shape {a.shape}.")
    keep = kept_positions(a, config, token_slice, signal=signal)
    x = prepare_signal(np.asarray(signal)[keep], config.signal)
    out = np.empty((a.shape[0], len(STAT_NAMES)))
    for head in range(a.shape[0]):
        stats = _graph_stats(attention_adjacency(a[head])[np.ix_(keep, keep)], x, config, method)
        out[head] = [getattr(stats, name) for name in STAT_NAMES]
    return out


def config_statistic(
    attention: np.ndarray,
    signal: np.ndarray,
    config: GraphConfig,
    statistic: str,
    *,
    token_slice: slice | None = None,
    method: Method = "exact",
) -> float:
    """One statistic of ``config_stats`` at the least cost: with ``method="fast"`` the Fiedler value is a
    single-precision Lanczos solve on a graph built in single precision (no signal, no eigendecomposition:
    an inline switch on λ_2 pays only this); every other statistic is ``config_stats``' value."""
    _checked_method(method)
    if statistic not in STAT_NAMES:
        raise SpectralInputError(f"Unknown statistic '{statistic}'. Allowed values: {list(STAT_NAMES)}")
    if method == "fast" and statistic == "fiedler":
        a = np.asarray(attention, dtype=np.float32)
        if not np.all(np.isfinite(a)) or a.min() < 0:
            raise SpectralInputError("Attention must be finite and non-negative to be a graph's edge weights.")
        mean = a.mean(axis=0) if a.ndim == 3 else a  # float32 in, float32 out: a fifth of the float64 cost
        keep = kept_positions(mean, config, token_slice, signal=signal)
        part = mean[np.ix_(keep, keep)]
        return symmetric_fiedler((part + part.T) / 2.0, config.laplacian)
    return float(getattr(config_stats(attention, signal, config, token_slice=token_slice, method=method), statistic))
