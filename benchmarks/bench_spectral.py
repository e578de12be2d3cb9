"""The spectral kill switch's cost (seed 004 claims < 1 ms; our goals: the statistic alone < 1 ms per
layer at 512 tokens, the whole gate < 5 % over a plain forward pass).

Text: real BIPIA email contexts from the mirror, concatenated and cut to exactly ``--tokens`` tokens.
1. The statistic alone, per layer: symmetrised head-mean adjacency, Laplacian, full eigendecomposition
   (numpy eigh, float64), projection of the 576-dimensional hidden states, HFER / entropy / Fiedler /
   smoothness. Median over layers × repeats, from one real forward pass's attention and hidden states.
2. The gate vs a plain forward pass (same transformers model, float32, CPU, eager attention):
   plain = ``model(ids, logits_to_keep=1)`` (a generation prefill: no attention / hidden-state outputs, the LM head
   on the last position only, as generation needs); gate = forward with both outputs +
   the statistic at one layer. Also the gate that stops after the chosen early layer (what an inline
   switch at layer ℓ needs). Medians over repeats; ratios measured side by side.

    .venv/bin/python benchmarks/bench_spectral.py [--tokens 512] [--repeats 5] [--layer 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_results import Row, add_results_dir_argument, record

GOAL_STATISTIC_MS = 1.0  # our goal (the seed claims < 1 ms)


def real_text(tokenizer, n_tokens: int) -> str:  # type: ignore[no-untyped-def]
    from rvu_pipelines.spectral.data import load_spectral_datasets

    bipia = load_spectral_datasets()["bipia"]
    parts, ids = [], []
    for row in bipia.filter(bipia["label"] == 0).iter_rows(named=True):
        parts.append(row["text"][row["doc_start"] : row["doc_end"]])
        ids = tokenizer("\n\n".join(parts))["input_ids"]
        if len(ids) >= n_tokens:
            break
    return tokenizer.decode(ids[:n_tokens])


def median_ms(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layer", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    add_results_dir_argument(parser)
    args = parser.parse_args()

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from rvu_pipelines.spectral import attention_adjacency, layer_stats_from_trace, load_profile_model, spectral_stats

    model = load_profile_model()
    text = real_text(model.tokenizer, args.tokens)
    trace = model.forward(text)
    n = len(trace.tokens)
    print(
        f"model {model.name}: {model.n_layers} layers, {model.n_heads} heads; text {n} tokens; {args.threads} threads"
    )

    per_layer = []
    for layer in range(model.n_layers):
        attention, signal = trace.attentions[layer], trace.hidden_states[layer]
        per_layer.append(
            median_ms(lambda a=attention, x=signal: spectral_stats(attention_adjacency(a), x), args.repeats)
        )
    eigh_only = median_ms(lambda: np.linalg.eigh(np.eye(n) + attention_adjacency(trace.attentions[0])), args.repeats)
    print(
        f"1. statistic alone, per layer at {n} tokens: median {statistics.median(per_layer):.2f} ms "
        f"(min {min(per_layer):.2f}, max {max(per_layer):.2f}; of which eigh {eigh_only:.2f} ms); goal < 1 ms"
    )

    from rvu_pipelines.spectral import fast_fiedler, fast_spectral_stats, graph_config, prepare_signal
    from rvu_pipelines.spectral.config import kept_positions

    config = graph_config("sink_free")
    exact_ms, fast_ms, errors = [], [], []
    for layer in range(model.n_layers):
        keep = kept_positions(trace.attentions[layer], config)
        w = attention_adjacency(trace.attentions[layer])[np.ix_(keep, keep)]
        x = prepare_signal(trace.hidden_states[layer][keep], config.signal)
        exact = spectral_stats(w, x, kind=config.laplacian)
        fast = fast_spectral_stats(w, x, kind=config.laplacian)
        errors.append([abs(getattr(fast, k) - getattr(exact, k)) for k in ("hfer", "spectral_entropy", "smoothness")])
        exact_ms.append(median_ms(lambda w=w, x=x: spectral_stats(w, x, kind=config.laplacian), args.repeats))
        fast_ms.append(median_ms(lambda w=w, x=x: fast_spectral_stats(w, x, kind=config.laplacian), args.repeats))
    worst = np.max(errors, axis=0)
    print(
        f"1b. sink_free statistic per layer (graph built): exact {statistics.median(exact_ms):.2f} ms | "
        f"fast {statistics.median(fast_ms):.2f} ms; max abs error over layers: HFER {worst[0]:.4f}, "
        f"entropy {worst[1]:.4f}, smoothness {worst[2]:.4f}"
    )

    from rvu_pipelines.spectral import config_statistic

    switch_fast, switch_exact, switch_graph, switch_error = [], [], [], []
    for layer in range(model.n_layers):
        attention, signal = trace.attentions[layer], trace.hidden_states[layer]
        keep = kept_positions(attention, config, signal=signal)
        w = attention_adjacency(attention)[np.ix_(keep, keep)]
        exact_value = spectral_stats(w, prepare_signal(signal[keep], config.signal), kind=config.laplacian).fiedler
        fast_value = config_statistic(attention, signal, config, "fiedler", method="fast")
        switch_error.append(abs(fast_value - exact_value))
        switch_graph.append(median_ms(lambda w=w: fast_fiedler(w, config.laplacian), args.repeats))
        switch_fast.append(
            median_ms(
                lambda a=attention, x=signal: config_statistic(a, x, config, "fiedler", method="fast"), args.repeats
            )
        )
        switch_exact.append(
            median_ms(lambda a=attention, x=signal: config_statistic(a, x, config, "fiedler"), args.repeats)
        )
    graph_ms, fast_ms_1c, exact_ms_1c = (statistics.median(v) for v in (switch_graph, switch_fast, switch_exact))
    print(
        f"1c. the switch's statistic alone (sink_free Fiedler value) per layer: built graph {graph_ms:.2f} ms | "
        f"from the layer's attention {fast_ms_1c:.2f} ms (exact path {exact_ms_1c:.2f} ms, "
        f"{exact_ms_1c / fast_ms_1c:.1f}x); max abs error {max(switch_error):.1e}; goal < {GOAL_STATISTIC_MS:g} ms"
    )

    encoded = model.tokenizer(text, return_tensors="pt")

    def plain() -> None:
        with torch.inference_mode():
            model.model(**encoded, use_cache=False, logits_to_keep=1)  # generation's prefill: last logits only

    def gate() -> None:  # the full forward pass with attentions and hidden states, then the statistic
        layer_stats_from_trace(model.forward(text), layers=[args.layer])

    def early_gate() -> None:
        layers = model.model.model.layers
        keep = model.model.config.num_hidden_layers
        try:  # run only the layers the switch reads (0..ℓ)
            model.model.model.layers = layers[: args.layer + 1]
            model.model.config.num_hidden_layers = args.layer + 1
            with torch.inference_mode():
                out = model.model.model(**encoded, output_attentions=True, output_hidden_states=True, use_cache=False)
            spectral_stats(
                attention_adjacency(out.attentions[args.layer][0].numpy()),
                out.hidden_states[args.layer + 1][0].numpy(),
            )
        finally:
            model.model.model.layers = layers
            model.model.config.num_hidden_layers = keep

    plain_ms = median_ms(plain, args.repeats)
    gate_ms = median_ms(gate, args.repeats)
    early_ms = median_ms(early_gate, args.repeats)
    print(
        f"2. plain forward {plain_ms:.1f} ms; gate (forward with attentions + statistic at layer {args.layer}) "
        f"{gate_ms:.1f} ms = {100 * (gate_ms / plain_ms - 1):+.1f} %; goal < +5 %"
    )
    print(
        f"   early-exit gate (layers 0..{args.layer + 1} only + statistic) {early_ms:.1f} ms = "
        f"{100 * early_ms / plain_ms:.1f} % of a plain forward pass (it runs before, not instead of, generation)"
    )
    plain_label = "plain forward (prefill)"
    rows = [
        Row(f"ms per pass, {n} tokens", plain_label, plain_ms, f"gate at layer {args.layer}", gate_ms, "ms", False),
        Row(
            f"ms per pass, {n} tokens",
            plain_label,
            plain_ms,
            f"early-exit gate (layers 0..{args.layer + 1})",
            early_ms,
            "ms",
            False,
        ),
        Row(
            f"statistic alone per layer (median), {n} tokens",
            "goal",
            GOAL_STATISTIC_MS,
            "HFER / spectral stats",
            statistics.median(per_layer),
            "ms",
            False,
        ),
    ]
    rows.append(
        Row(
            f"sink_free statistic per layer (median), {n} tokens",
            "exact (eigh)",
            statistics.median(exact_ms),
            "fast (Chebyshev moments)",
            statistics.median(fast_ms),
            "ms",
            False,
        )
    )
    rows.append(
        Row(
            f"the switch's Fiedler value per layer (median), {n} tokens, from attention",
            "exact (eigh)",
            exact_ms_1c,
            "fast (float32 Lanczos)",
            fast_ms_1c,
            "ms",
            False,
        )
    )
    rows.append(
        Row(
            f"the switch's Fiedler value per layer (median), {n} tokens, graph built",
            "goal",
            GOAL_STATISTIC_MS,
            "fast (float32 Lanczos)",
            graph_ms,
            "ms",
            False,
        )
    )
    record(__file__, rows, args.results_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
