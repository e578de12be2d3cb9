"""LLM throughput: llama.cpp's own prompt / generation tokens/s (llama-bench style) vs what the harness gets.

Run:  .venv/bin/python benchmarks/bench_llm_throughput.py [--rounds 3] [--threads N]

Same model (the tiny profile's GGUF), same process, rounds alternating between the measurements so
machine noise hits them alike; medians reported.

* llama.cpp's own, at the low-level API (``Llama.eval`` = ``llama_decode`` per batch, no sampling, no
  chat template): ``pp512`` (a 512-token prompt into an empty context, n_batch 512 as llama-bench's
  default micro-batch) and ``tg128`` (128 single-token decodes from an empty context), llama-bench's two
  standard tests; then the same two at the agent's shape: a ~730-token prompt and 48 tokens after it.
* the harness: ``LlamaCppChatModel.chat`` (cold, ``prefix_reuse="off"``) on the agent-shaped scenarios of
  ``bench_agent_speed.py``: llama.cpp's own timers for its prompt and generation phases, and the wall
  time around the call; the difference is ours (chat template, tokenising, sampling, detokenising).
* the knobs, at the agent's shape: threads 1 vs 2, n_batch 64 vs 512, flash attention off vs on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_agent_speed import AGENT_RULES, scenario_messages, tool_schema  # noqa: E402
from bench_results import Row, add_results_dir_argument, record  # noqa: E402

from rvu_pipelines.models import LlamaCppChatModel, ModelStore, load_model_config  # noqa: E402
from rvu_pipelines.models.kv_prefixes import CHUNK_TOKENS  # noqa: E402
from rvu_pipelines.models.llama_runtime import open_llama  # noqa: E402


def raw_llama(path: Path, *, threads: int, n_batch: int, flash_attn: bool = False) -> Any:
    import llama_cpp

    return open_llama(
        llama_cpp.Llama,
        path,
        n_ctx=2048,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=n_batch,
        n_ubatch=n_batch,
        flash_attn=flash_attn,
        seed=0,
        verbose=False,
    )


def prompt_rate(llm: Any, tokens: list[int]) -> float:
    llm.reset()
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    started = time.perf_counter()
    llm.eval(tokens)
    return len(tokens) / (time.perf_counter() - started)


def generation_rate(llm: Any, context: list[int], n: int) -> float:
    """Single-token decodes after ``context`` (which is evaluated first, untimed)."""
    llm.reset()
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    if context:
        llm.eval(context)
    started = time.perf_counter()
    for i in range(n):
        llm.eval([1000 + i % 500])
    return n / (time.perf_counter() - started)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--scenarios", type=int, default=4, help="harness calls per round")
    parser.add_argument("--max-tokens", type=int, default=48)
    add_results_dir_argument(parser)
    args = parser.parse_args(argv)
    resolved = ModelStore().resolve("llm", load_model_config().profile("tiny")["llm"])
    path, threads = resolved.path, args.threads
    print(f"model {resolved.name} ({path.name}), {os.cpu_count()} cores, threads {threads}, rounds {args.rounds}")

    own = raw_llama(path, threads=threads, n_batch=512)
    filler = own.tokenize(("The agent reads a tool result and decides what to do next. " * 200).encode())
    pp512_tokens = filler[:512]
    system = AGENT_RULES + tool_schema()
    prompts = [scenario_messages(system, i) for i in range(args.scenarios)]
    harness = LlamaCppChatModel(path, n_ctx=2048, n_threads=threads, name=resolved.name, prefix_reuse="off")
    agent_tokens = harness.tokenize(system)  # shape only: the rendered prompt is ~150 tokens longer
    agent_prompt = (agent_tokens + filler)[:730]
    knobs = {
        "threads 1, n_batch 64": raw_llama(path, threads=1, n_batch=64),
        f"threads {threads}, n_batch 64 (project)": raw_llama(path, threads=threads, n_batch=CHUNK_TOKENS),
        f"threads {threads}, n_batch 512": own,
        f"threads {threads}, n_batch 64, flash attention": raw_llama(
            path, threads=threads, n_batch=CHUNK_TOKENS, flash_attn=True
        ),
    }

    results: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    for _ in range(args.rounds):
        add("pp512", prompt_rate(own, pp512_tokens))
        add("tg128", generation_rate(own, [], 128))
        for name, llm in knobs.items():
            add(f"{name}: pp730", prompt_rate(llm, agent_prompt))
            add(f"{name}: tg48@730", generation_rate(llm, agent_prompt, args.max_tokens))
        for messages in prompts:
            started = time.perf_counter()
            completion = harness.chat(messages, max_tokens=args.max_tokens)
            wall = time.perf_counter() - started
            add("harness prompt tok/s", completion.prompt_tokens_per_s)
            add("harness generation tok/s", completion.generation_tokens_per_s)
            add("harness prompt tokens", float(completion.prompt_tokens))
            add("harness generated tokens", float(completion.completion_tokens))
            add("harness wall s", wall)
            add("harness outside llama.cpp s", wall - completion.prompt_seconds - completion.generation_seconds)

    project = f"threads {threads}, n_batch 64 (project)"
    print("\nllama.cpp's own (llama-bench tests, low-level decode, n_batch 512):")
    print(f"  pp512  {median(results['pp512']):7.1f} tok/s      tg128  {median(results['tg128']):7.1f} tok/s")
    print("\nat the agent's shape (730-token prompt, 48 tokens after it), per configuration:")
    for name in knobs:
        print(
            f"  {name:<44} pp730 {median(results[f'{name}: pp730']):7.1f} tok/s   "
            f"tg48@730 {median(results[f'{name}: tg48@730']):6.1f} tok/s"
        )
    h_pp, h_tg = median(results["harness prompt tok/s"]), median(results["harness generation tok/s"])
    wall, outside = median(results["harness wall s"]), median(results["harness outside llama.cpp s"])
    print(
        f"\nharness (LlamaCppChatModel.chat, cold, {args.scenarios} agent scenarios x {args.rounds} rounds): "
        f"{median(results['harness prompt tokens']):.0f} prompt tokens, "
        f"{median(results['harness generated tokens']):.0f} generated; prompt {h_pp:.1f} tok/s, "
        f"generation {h_tg:.1f} tok/s; wall {wall:.2f} s per call, of which {outside * 1000:.0f} ms outside "
        f"llama.cpp's timers ({outside / wall:.1%})"
    )
    raw_pp, raw_tg = median(results[f"{project}: pp730"]), median(results[f"{project}: tg48@730"])
    print(
        f"ratios, harness / llama.cpp's own at the same shape and settings: prompt {h_pp / raw_pp:.2f}, "
        f"generation {h_tg / raw_tg:.2f}"
    )
    print(
        f"ratios, harness / llama-bench's tests (different shapes: the agent's context is longer): prompt "
        f"{h_pp / median(results['pp512']):.2f}, generation {h_tg / median(results['tg128']):.2f}"
    )
    own_label = f"llama.cpp's own ({project})"
    harness_label = "harness (LlamaCppChatModel.chat, cold)"
    rows = [
        Row("prompt tok/s, agent shape (~730 tokens)", own_label, raw_pp, harness_label, h_pp, "tok/s", True),
        Row(
            f"generation tok/s, agent shape ({args.max_tokens} after ~730)",
            own_label,
            raw_tg,
            harness_label,
            h_tg,
            "tok/s",
            True,
        ),
    ]
    record(__file__, rows, args.results_dir, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
