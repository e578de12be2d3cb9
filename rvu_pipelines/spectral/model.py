"""The agent's own weights in transformers, one forward pass per text, attention graphs and hidden states out.

The packaged SmolLM2 GGUF (the file llama.cpp runs in the agent) is loaded with
``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)``: transformers de-quantises it to float32, on
CPU, with the eager attention kernel (the fused SDPA kernel returns no attention weights), through
``models.dequantized`` (which keeps the converted weights as safetensors, so later loads take seconds).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rvu_pipelines.models.dequantized import load_dequantized
from rvu_pipelines.spectral.config import GraphConfig, Method, config_stats, per_head_stats
from rvu_pipelines.spectral.errors import ContextLengthError, LayerIndexError, NoAttentionError, SpectralInputError
from rvu_pipelines.spectral.graph import (
    DEFAULT_CUTOFF_RATIO,
    LaplacianKind,
    SpectralStats,
    attention_adjacency,
    spectral_stats,
)

DEFAULT_N_CTX = 2048
_CACHE_LOCK = threading.Lock()
_FORWARD_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str], SpectralModel] = {}


@dataclass(frozen=True)
class ForwardTrace:
    """One forward pass: per layer, attention (heads × N × N) and the layer's output hidden states (N × d)."""

    tokens: list[str]
    attentions: list[np.ndarray]
    hidden_states: list[np.ndarray]

    @property
    def n_layers(self) -> int:
        return len(self.attentions)


def _check_layers(layers: Sequence[int] | None, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    chosen = [int(layer) for layer in layers]
    bad = [layer for layer in chosen if not 0 <= layer < n_layers]
    if bad:
        raise LayerIndexError(f"Layer index {bad[0]} is out of range: the model has layers 0 to {n_layers - 1}.")
    return chosen


def layer_stats_from_trace(
    trace: ForwardTrace,
    layers: Sequence[int] | None = None,
    *,
    token_slice: slice | None = None,
    kind: LaplacianKind = "combinatorial",
    cutoff_ratio: float = DEFAULT_CUTOFF_RATIO,
    config: GraphConfig | None = None,
    method: Method = "exact",
) -> dict[int, SpectralStats]:
    """Per chosen layer, the statistics of the layer's hidden states on its symmetrised attention graph;
    ``token_slice`` restricts both to the induced subgraph of those tokens (e.g. a tool output's span).
    A ``config`` (``config.GRAPH_CONFIGS``) replaces ``kind`` and ``cutoff_ratio`` and decides sinks, signal
    and eigenpairs (always the head-mean graph here: ``head_stats_from_trace`` gives one graph per head);
    ``method="fast"`` (with a config) uses ``fast.fast_spectral_stats``."""
    chosen = _check_layers(layers, trace.n_layers)
    if config is not None:
        return {
            layer: config_stats(
                trace.attentions[layer], trace.hidden_states[layer], config, token_slice=token_slice, method=method
            )
            for layer in chosen
        }
    if method != "exact":
        raise SpectralInputError("method='fast' needs a graph configuration (config=graph_config(...)).")
    part = token_slice or slice(None)
    out: dict[int, SpectralStats] = {}
    for layer in chosen:
        adjacency = attention_adjacency(trace.attentions[layer])[part, part]
        if adjacency.shape[0] == 0:
            raise SpectralInputError(f"The token slice {token_slice} selects no tokens of {len(trace.tokens)}.")
        out[layer] = spectral_stats(adjacency, trace.hidden_states[layer][part], kind=kind, cutoff_ratio=cutoff_ratio)
    return out


def head_stats_from_trace(
    trace: ForwardTrace,
    layers: Sequence[int] | None = None,
    *,
    config: GraphConfig,
    token_slice: slice | None = None,
    method: Method = "exact",
) -> np.ndarray:
    """Layers × heads × ``STAT_NAMES``: every head's own graph (``config.per_head_stats``), e.g. as features
    of a logistic probe; layers in the order given."""
    chosen = _check_layers(layers, trace.n_layers)
    return np.stack(
        [
            per_head_stats(
                trace.attentions[layer], trace.hidden_states[layer], config, token_slice=token_slice, method=method
            )
            for layer in chosen
        ]
    )


class SpectralModel:
    """A causal LM that hands back attention weights and hidden states for one text."""

    def __init__(self, model: Any, tokenizer: Any, *, n_ctx: int = DEFAULT_N_CTX, name: str = "model") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        limit = getattr(model.config, "max_position_embeddings", None) or n_ctx
        self.n_ctx = int(min(n_ctx, limit))
        self.n_layers = int(model.config.num_hidden_layers)
        self.n_heads = int(model.config.num_attention_heads)

    def tokenize(self, text: str) -> dict[str, Any]:
        if not isinstance(text, str) or not text.strip():
            raise SpectralInputError("The text is empty: there is no token graph to analyse.")
        encoded = self.tokenizer(text, return_tensors="pt", return_offsets_mapping=True)
        n = int(encoded["input_ids"].shape[1])
        if n > self.n_ctx:
            raise ContextLengthError(
                f"The text has {n} tokens, more than {self.name}'s context of {self.n_ctx}; shorten it or split it."
            )
        return dict(encoded)

    def forward(self, text: str, up_to_layer: int | None = None) -> ForwardTrace:
        """One forward pass with attentions and hidden states (float32 numpy, batch dimension dropped).

        ``up_to_layer=ℓ`` stops early: only layers 0..ℓ+1 run (an inline switch at an early layer pays a
        fraction of a forward pass) and the trace holds those layers. One layer past ℓ runs because
        transformers records the *final-norm* output as the last hidden state: ℓ's own output is exact only
        while ℓ is not the last layer run (so the last model layer's signal is post-norm in every mode)."""
        import torch

        encoded = self.tokenize(text)
        encoded.pop("offset_mapping", None)
        run = (
            self.n_layers
            if up_to_layer is None
            else min(self.n_layers, _check_layers([up_to_layer], self.n_layers)[0] + 2)
        )
        with _FORWARD_LOCK, torch.inference_mode():
            config = self.model.config
            try:
                config.num_hidden_layers = run
                # the decoder without its LM head: logits (vocabulary × tokens) are half a pass at 135M
                base = self.model.model if hasattr(self.model, "model") else self.model
                outputs = base(**encoded, output_attentions=True, output_hidden_states=True, use_cache=False)
            finally:
                config.num_hidden_layers = self.n_layers
        attentions = getattr(outputs, "attentions", None)
        if not attentions or any(a is None for a in attentions):
            raise NoAttentionError(
                f"{self.name} returned no attention weights; load it with attn_implementation='eager' "
                "(fused SDPA / flash kernels do not materialise them)."
            )
        hidden = outputs.hidden_states
        tokens = self.tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
        return ForwardTrace(
            tokens=list(tokens),
            attentions=[a[0].float().numpy() for a in attentions],
            # hidden_states[0] is the embedding output; layer ℓ's output is hidden_states[ℓ + 1]
            hidden_states=[h[0].float().numpy() for h in hidden[1:]],
        )

    def token_slice(self, text: str, start: int, end: int, encoded: dict[str, Any] | None = None) -> slice:
        """The tokens whose characters overlap ``text[start:end]`` (``encoded``: ``text`` already tokenized)."""
        offsets = (encoded or self.tokenize(text))["offset_mapping"][0].tolist()
        inside = [i for i, (a, b) in enumerate(offsets) if b > start and a < end]
        if not inside:
            raise SpectralInputError(f"Characters {start}:{end} cover no token of the text.")
        return slice(inside[0], inside[-1] + 1)

    def layer_stats(
        self,
        text: str,
        layers: Sequence[int] | None = None,
        *,
        span: tuple[int, int] | None = None,
        kind: LaplacianKind = "combinatorial",
        cutoff_ratio: float = DEFAULT_CUTOFF_RATIO,
        config: GraphConfig | None = None,
        method: Method = "exact",
    ) -> dict[int, SpectralStats]:
        """Statistics per layer from one forward pass; ``span`` (characters) restricts to a part of the text;
        ``config`` / ``method`` as in ``layer_stats_from_trace``."""
        chosen = _check_layers(layers, self.n_layers)
        trace = self.forward(text, up_to_layer=max(chosen) if layers is not None else None)
        token_slice = self.token_slice(text, *span) if span is not None else None
        return layer_stats_from_trace(
            trace,
            layers,
            token_slice=token_slice,
            kind=kind,
            cutoff_ratio=cutoff_ratio,
            config=config,
            method=method,
        )


def load_spectral_model(gguf_path: str | Path, *, sha256: str = "", n_ctx: int = DEFAULT_N_CTX) -> SpectralModel:
    """The GGUF's weights in transformers (float32, CPU, eager attention), once per process."""
    path = Path(gguf_path)
    if not path.is_file():
        raise SpectralInputError(f"No GGUF file at {path}.")
    key = (str(path.resolve()), sha256)
    with _CACHE_LOCK:
        if key in _LOADED:
            return _LOADED[key]
        try:
            model, tokenizer = load_dequantized(path, sha256=sha256, attn_implementation="eager")
        except FileNotFoundError as exc:
            raise SpectralInputError(str(exc)) from exc
        loaded = SpectralModel(model, tokenizer, n_ctx=n_ctx, name=path.name)
        _LOADED[key] = loaded
        return loaded


def load_profile_model(profile: str = "tiny") -> SpectralModel:
    """The LLM of a model profile (resolved and sha256-verified by the model store)."""
    from rvu_pipelines.models import ModelStore, load_model_config

    resolved = ModelStore().resolve("llm", load_model_config().profile(profile)["llm"])
    return load_spectral_model(resolved.path, sha256=resolved.sha256, n_ctx=resolved.n_ctx)
