"""Graph/signal configurations: the seed-study path unchanged, sinks removed, signals centred, Laplacians."""

from __future__ import annotations

import numpy as np
import pytest

from rvu_pipelines.spectral import (
    GRAPH_CONFIGS,
    ForwardTrace,
    GraphConfig,
    SpectralInputError,
    attention_adjacency,
    config_stats,
    graph_config,
    head_stats_from_trace,
    kept_modes,
    laplacian,
    layer_stats_from_trace,
    prepare_signal,
    sink_positions,
    spectral_stats,
)
from rvu_pipelines.spectral.config import kept_positions


def causal_attention(rng: np.random.Generator, heads: int, n: int) -> np.ndarray:
    logits = rng.normal(size=(heads, n, n))
    logits[:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] = -np.inf
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)).astype(np.float32)


def synthetic_trace(seed: int = 0, layers: int = 2, heads: int = 3, n: int = 24, d: int = 8) -> ForwardTrace:
    rng = np.random.default_rng(seed)
    return ForwardTrace(
        tokens=[f"t{i}" for i in range(n)],
        attentions=[causal_attention(rng, heads, n) for _ in range(layers)],
        hidden_states=[rng.normal(size=(n, d)).astype(np.float32) for _ in range(layers)],
    )


@pytest.mark.parametrize("token_slice", [None, slice(3, 17)])
def test_seed_study_is_bit_identical_to_the_old_path(token_slice: slice | None) -> None:
    trace = synthetic_trace()
    old = layer_stats_from_trace(trace, token_slice=token_slice)
    new = layer_stats_from_trace(trace, token_slice=token_slice, config=graph_config("seed_study"))
    assert old == new  # dataclass equality: every float identical


def test_graph_config_names_the_allowed_values() -> None:
    with pytest.raises(SpectralInputError) as error:
        graph_config("nope")
    for name in ("seed_study", "sink_free", "sink_free_norm", "spectral_trust"):
        assert name in str(error.value)
    assert graph_config("sink_free") is GRAPH_CONFIGS["sink_free"]
    with pytest.raises(SpectralInputError, match="Allowed values"):
        GraphConfig(signal="whitened")  # type: ignore[arg-type]
    with pytest.raises(SpectralInputError):
        GraphConfig(eigenpairs=1)


def test_sinks_are_token_zero_and_a_planted_heavy_column() -> None:
    rng = np.random.default_rng(1)
    attention = causal_attention(rng, 2, 40).astype(np.float64)
    attention[:, 6:, 5] += 2.0  # every later token sends half its attention to position 5
    attention /= attention.sum(axis=-1, keepdims=True)
    sinks = sink_positions(attention, 0.3)
    assert sinks.tolist() == [0, 5]
    config = GraphConfig(exclude_sinks=True, sink_threshold=0.3)
    kept = kept_positions(attention, config)
    assert 0 not in kept and 5 not in kept and kept.size == 38
    # the recency-heavy last positions are not sinks
    assert sink_positions(np.tril(np.ones((12, 12))) / np.arange(1, 13)[:, None], 0.3).tolist() == [0]


def test_the_norm_rule_drops_an_unattended_massive_activation_the_attention_rule_keeps() -> None:
    rng = np.random.default_rng(2)
    attention = causal_attention(rng, 2, 40)
    signal = rng.normal(size=(40, 16))
    signal[27] *= 9.0  # a massive activation nobody attends to
    attention_only = kept_positions(attention, GRAPH_CONFIGS["sink_free"], signal=signal)
    with_norm = kept_positions(attention, GRAPH_CONFIGS["sink_free_norm"], signal=signal)
    assert 27 in attention_only
    assert np.setdiff1d(attention_only, with_norm).tolist() == [27]
    # it changes the statistic: the planted token no longer dominates the centred energy
    free = config_stats(attention, signal, GRAPH_CONFIGS["sink_free"])
    norm = config_stats(attention, signal, GRAPH_CONFIGS["sink_free_norm"])
    assert norm.n_tokens == free.n_tokens - 1 and norm != free
    # ordinary spread of norms (none near the factor) drops nothing
    plain = rng.normal(size=(40, 16))
    assert np.array_equal(
        kept_positions(attention, GRAPH_CONFIGS["sink_free_norm"], signal=plain),
        kept_positions(attention, GRAPH_CONFIGS["sink_free"], signal=plain),
    )


def test_the_norm_rule_needs_the_signal_and_a_sensible_factor() -> None:
    attention = causal_attention(np.random.default_rng(3), 2, 12)
    with pytest.raises(SpectralInputError, match="hidden states"):
        kept_positions(attention, GRAPH_CONFIGS["sink_free_norm"])
    with pytest.raises(SpectralInputError, match="tokens"):
        kept_positions(attention, GRAPH_CONFIGS["sink_free_norm"], signal=np.ones((5, 3)))
    for bad in (1.0, 0.5, float("nan"), float("inf")):
        with pytest.raises(SpectralInputError, match="sink_norm_factor"):
            GraphConfig(exclude_sinks=True, sink_norm_factor=bad)
    with pytest.raises(SpectralInputError, match="exclude_sinks"):
        GraphConfig(sink_norm_factor=4.0)


def test_centred_signal_of_a_constant_vector_has_no_energy() -> None:
    trace = synthetic_trace()
    constant = np.tile(np.arange(8.0), (24, 1))
    stats = config_stats(trace.attentions[0], constant, GraphConfig(signal="centred", laplacian="normalized"))
    assert stats.hfer == 0.0 and stats.smoothness == 0.0 and stats.spectral_entropy == 0.0
    normalised = prepare_signal(np.random.default_rng(2).normal(size=(10, 4)), "normalised")
    np.testing.assert_allclose(np.linalg.norm(normalised, axis=1), 1.0)


def test_random_walk_spectrum_equals_the_normalised_one() -> None:
    rng = np.random.default_rng(3)
    w = attention_adjacency(causal_attention(rng, 2, 15))
    rw = np.sort(np.linalg.eigvals(laplacian(w, "random_walk")).real)
    np.testing.assert_allclose(rw, np.linalg.eigvalsh(laplacian(w, "normalized")), atol=1e-10)
    x = rng.normal(size=(15, 4))
    stats = spectral_stats(w, x, kind="random_walk")
    degrees = w.sum(axis=1)
    # smoothness is the D-norm Rayleigh quotient of I − D⁻¹W
    expected = np.trace(x.T @ laplacian(w) @ x) / np.trace(x.T @ (degrees[:, None] * x))
    assert stats.smoothness == pytest.approx(expected, rel=1e-9)
    assert stats.fiedler == pytest.approx(np.linalg.eigvalsh(laplacian(w, "normalized"))[1], abs=1e-10)


def test_eigenpairs_keep_both_ends_of_the_spectrum() -> None:
    assert kept_modes(100, 50).tolist() == list(range(25)) + list(range(75, 100))
    assert kept_modes(30, 50).tolist() == list(range(30))
    rng = np.random.default_rng(4)
    w = attention_adjacency(causal_attention(rng, 2, 20))
    x = rng.normal(size=(20, 5))
    assert spectral_stats(w, x, eigenpairs=50) == spectral_stats(w, x)
    partial = spectral_stats(w, x, eigenpairs=10)
    assert partial.smoothness == pytest.approx(spectral_stats(w, x).smoothness)
    assert 0.0 <= partial.hfer <= 1.0 and 0.0 <= partial.spectral_entropy <= 1.0


def test_per_head_statistics_shape_and_agreement() -> None:
    trace = synthetic_trace(heads=4)
    features = head_stats_from_trace(trace, [1, 0], config=graph_config("sink_free"))
    assert features.shape == (2, 4, 4)
    same = ForwardTrace(trace.tokens, [np.repeat(a[:1], 4, axis=0) for a in trace.attentions], trace.hidden_states)
    per_head = head_stats_from_trace(same, [0], config=graph_config("sink_free"))[0]
    mean = layer_stats_from_trace(same, [0], config=graph_config("sink_free"))[0]
    expected = [mean.hfer, mean.spectral_entropy, mean.fiedler, mean.smoothness]
    np.testing.assert_allclose(per_head, np.tile(expected, (4, 1)))


def test_real_model_sink_holds_the_energy_only_under_seed_study(spectral_model) -> None:
    text = (
        "Dear team, the quarterly report is attached. Revenue grew in every region except the north, "
        "where two stores closed for renovation. Please review the numbers before Friday's meeting."
    )
    trace = spectral_model.forward(text, up_to_layer=11)
    layers = [8, 11]  # at layers 3-5 an unattended massive-activation token still holds > 50 %
    shares = {}
    for name in ("seed_study", "sink_free"):
        config = graph_config(name)
        for layer in layers:
            keep = kept_positions(trace.attentions[layer], config)
            x = prepare_signal(trace.hidden_states[layer][keep], config.signal)
            energy = (x**2).sum(axis=1)
            shares[name, layer] = float(energy.max() / energy.sum())
    assert shares["seed_study", 11] > 0.9  # the sink, token 0, holds nearly all of ‖X‖²
    assert max(shares["sink_free", layer] for layer in layers) < 0.5
    stats = layer_stats_from_trace(trace, layers, config=graph_config("sink_free"))
    assert all(0.0 <= s.hfer <= 1.0 for s in stats.values())
