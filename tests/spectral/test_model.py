"""The spectral statistics from the real SmolLM2 forward pass (the GGUF the agent runs), and the bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

from rvu_pipelines.spectral import (
    ContextLengthError,
    LayerIndexError,
    NoAttentionError,
    SpectralInputError,
    attention_adjacency,
    layer_stats_from_trace,
    spectral_stats,
)

TEXT = (
    "Context: Who wrote the play 'Romeo and Juliet'? William Shakespeare.\n"
    "Statement: The answer to \"Who wrote the play 'Romeo and Juliet'?\" is Charles Dickens."
)


@pytest.fixture(scope="module")
def trace(spectral_model):
    return spectral_model.forward(TEXT)


def test_forward_returns_causal_attention_and_layer_outputs(spectral_model, trace) -> None:
    assert spectral_model.n_layers == 30 and trace.n_layers == 30 and len(trace.hidden_states) == 30
    n = len(trace.tokens)
    assert 20 < n < 60
    for attention in trace.attentions:
        assert attention.shape == (spectral_model.n_heads, n, n)
        np.testing.assert_allclose(attention.sum(axis=-1), 1.0, atol=1e-4)  # softmax rows
        assert np.abs(np.triu(attention, k=1)).max() < 1e-6  # causal: no attention to later tokens
    assert trace.hidden_states[0].shape == (n, 576)
    # layer ℓ's signal is its own output: consecutive layers differ
    assert not np.allclose(trace.hidden_states[0], trace.hidden_states[1])


def test_statistics_per_layer_are_valid_and_deterministic(spectral_model, trace) -> None:
    stats = layer_stats_from_trace(trace)
    assert sorted(stats) == list(range(30))
    for layer, s in stats.items():
        assert 0.0 <= s.hfer <= 1.0 and 0.0 <= s.spectral_entropy <= 1.0
        assert s.fiedler > 0.0  # the BOS sink connects every token: the graph is connected
        assert s.n_tokens == len(trace.tokens)
        direct = spectral_stats(attention_adjacency(trace.attentions[layer]), trace.hidden_states[layer])
        assert direct.hfer == pytest.approx(s.hfer)
    again = spectral_model.layer_stats(TEXT, layers=[2, 3])
    assert again[2] == stats[2] and again[3] == stats[3]
    # the layers are not all alike: HFER varies across depth
    assert np.ptp([s.hfer for s in stats.values()]) > 0.1


def test_span_restricts_to_the_statement_tokens(spectral_model) -> None:
    start = TEXT.index("Statement:")
    part = spectral_model.layer_stats(TEXT, layers=[3], span=(start, len(TEXT)))[3]
    whole = spectral_model.layer_stats(TEXT, layers=[3])[3]
    assert 10 < part.n_tokens < whole.n_tokens
    with pytest.raises(SpectralInputError):
        spectral_model.token_slice(TEXT, len(TEXT), len(TEXT) + 5)


def test_bad_inputs_give_clear_errors(spectral_model) -> None:
    with pytest.raises(SpectralInputError, match="empty"):
        spectral_model.layer_stats("   ")
    with pytest.raises(ContextLengthError, match="context of 2048"):
        spectral_model.layer_stats("token " * 3000)
    with pytest.raises(LayerIndexError, match="layers 0 to 29"):
        spectral_model.layer_stats(TEXT, layers=[30])
    with pytest.raises(LayerIndexError):
        spectral_model.layer_stats(TEXT, layers=[-1])


def test_a_model_without_attention_outputs_is_refused(spectral_model) -> None:
    spectral_model.model.set_attn_implementation("sdpa")  # the fused kernel materialises no weights
    try:
        with pytest.raises(NoAttentionError, match="eager"):
            spectral_model.forward(TEXT)
    finally:
        spectral_model.model.set_attn_implementation("eager")
    assert spectral_model.forward(TEXT).n_layers == 30


def test_early_exit_gives_the_same_statistics_as_the_full_pass(spectral_model, trace) -> None:
    full = layer_stats_from_trace(trace, layers=[0, 2, 3])
    early = spectral_model.forward(TEXT, up_to_layer=3)
    assert early.n_layers == 5  # layers 0..4 ran, not 30
    assert layer_stats_from_trace(early, layers=[0, 2, 3]) == full
    assert spectral_model.layer_stats(TEXT, layers=[3])[3] == full[3]
    assert spectral_model.forward(TEXT).n_layers == 30  # the model is whole again
