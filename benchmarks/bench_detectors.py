"""Detector latency on 2 CPU threads: the transformer detector D4 on PyTorch vs ONNX Runtime, side by side in one
run (goals: <= 5 ms/sample batched, <= 15 ms single-call p50, F1 within 0.5 point of the float PyTorch
reference), with D3 (NanoGuard), D2 and D1 for context.

D4 is the registered ``rvu-detector-d4-deepset`` when the MLflow store has it, else it is fine-tuned here on
deepset's training split with the seed settings (the time is printed), so the agreement lines compare real
trained scores. The ONNX graphs are exported from that same model (``detectors/onnx_d4.py``: fused float, and
int8 dynamic). Texts: the deepset test split (the goal's corpus, mostly short) and the jailbreak test split
(long, truncated to D4's 128 tokens). Batched = median over repeats of one ``score(all texts)`` call / n;
single = median (p50) of ``score([text])`` calls. Usage: ``python benchmarks/bench_detectors.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench_results import Row, add_results_dir_argument, record

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GOAL_MS = 5.0
SINGLE_GOAL_MS = 15.0
THREADS = 2


def batched_ms(detector, texts: list[str], repeats: int) -> float:
    detector.score(texts[:8])  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        detector.score(texts)
        times.append((time.perf_counter() - start) * 1000.0 / len(texts))
    return statistics.median(times)


def single_ms(detector, texts: list[str]) -> float:
    detector.score([texts[0]])
    times = []
    for text in texts:
        start = time.perf_counter()
        detector.score([text])
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def load_d4(corpus):
    """The registered deepset D4, else one fine-tuned here (same settings as the detector assets)."""
    from rvu_pipelines.detectors import load_registered_detector
    from rvu_pipelines.detectors.finetune import finetune, settings_for
    from rvu_pipelines.errors import RvuError

    try:
        registered = load_registered_detector("rvu-detector-d4-deepset")
        return getattr(registered, "detector", registered), "registered rvu-detector-d4-deepset"
    except RvuError:
        started = time.perf_counter()
        detector, _ = finetune(
            corpus.texts("train"), corpus.labels("train"), settings=settings_for("deepset"), progress=False
        )
        return detector, f"fine-tuned here on deepset train ({time.perf_counter() - started:.0f} s)"


def headline_rows(rows: list[tuple], reference: str, candidate: str) -> list[Row]:
    """D4's float PyTorch reference vs ONNX Runtime int8, batched and single p50 per corpus; the goals on deepset."""
    found = {(name, corpus): (batched, single) for name, corpus, _, batched, single in rows}
    out = []
    for corpus in ("deepset", "jailbreak"):
        base, new = found[(reference, corpus)], found[(candidate, corpus)]
        for i, what in enumerate(("batched ms/sample", "single-call p50 ms")):
            out.append(Row(f"D4 {what}, {corpus} test", reference, base[i], candidate, new[i], "ms", False))
    batched, single = found[(candidate, "deepset")]
    out.append(Row("D4 batched ms/sample, deepset test", "goal", GOAL_MS, candidate, batched, "ms", False))
    out.append(Row("D4 single-call p50 ms, deepset test", "goal", SINGLE_GOAL_MS, candidate, single, "ms", False))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--single", type=int, default=50, help="texts timed one by one")
    add_results_dir_argument(parser)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(THREADS)
    import tempfile
    from pathlib import Path

    from rvu_pipelines.detectors import HeuristicDetector, NanoGuardDetector, TfidfDetector, load_corpora
    from rvu_pipelines.detectors.onnx_d4 import OnnxDetector, agreement, export_detector

    corpora = load_corpora(["deepset", "jailbreak"])
    texts = {name: corpora[name].texts("test") for name in ("deepset", "jailbreak")}
    d4, d4_source = load_d4(corpora["deepset"])
    d2 = TfidfDetector.train(corpora["deepset"].texts("train"), corpora["deepset"].labels("train"))
    d4_int8 = d4.quantized()
    folder = Path(tempfile.mkdtemp(prefix="rvu-onnx-d4-"))
    started = time.perf_counter()
    export_detector(d4, folder)
    export_s = time.perf_counter() - started
    onnx = {v: OnnxDetector.load(folder, v, encoder=d4.encoder, threads=THREADS) for v in ("float", "int8")}
    d4_variants = (
        ("D4 PyTorch float32 (reference)", d4),
        ("D4 PyTorch int8 dynamic", d4_int8),
        ("D4 ONNX Runtime float32, fused", onnx["float"]),
        ("D4 ONNX Runtime int8, fused", onnx["int8"]),
    )
    rows = []
    for label, detector in d4_variants:
        for corpus, sample in texts.items():
            rows.append(
                (
                    label,
                    corpus,
                    len(sample),
                    batched_ms(detector, sample, args.repeats),
                    single_ms(detector, sample[: args.single]),
                )
            )
    nano = NanoGuardDetector()
    rows.append(
        (
            "D3 NanoGuard",
            "deepset",
            32,
            batched_ms(nano, texts["deepset"][:32], 1),
            single_ms(nano, texts["deepset"][:8]),
        )
    )
    for name, detector in (("D2 TF-IDF+LR", d2), ("D1 Heuristic", HeuristicDetector())):
        rows.append(
            (
                name,
                "deepset",
                len(texts["deepset"]),
                batched_ms(detector, texts["deepset"], args.repeats),
                single_ms(detector, texts["deepset"][: args.single]),
            )
        )

    print(
        f"\nDetector latency, torch threads = {THREADS} ({os.cpu_count()} CPUs visible); D4 = {d4_source}; "
        f"D4 max_length = {d4.settings.max_length} tokens"
    )
    print("| detector | texts | n | batched ms/sample | single ms/sample |\n|---|---|---|---|---|")
    for name, corpus, n, batched, single in rows:
        print(f"| {name} | {corpus} test | {n} | {batched:.2f} | {single:.2f} |")
    print(f"ONNX export (trace + fuse + int8 quantise): {export_s:.1f} s")
    base_batched = {corpus: batched for name, corpus, _, batched, _ in rows if name == d4_variants[0][0]}
    base_single = {corpus: single for name, corpus, _, _, single in rows if name == d4_variants[0][0]}
    print(
        "\n| D4 runtime | texts | batched speed-up vs reference | single speed-up | batched goal <= 5 ms | "
        "single p50 goal <= 15 ms |\n|---|---|---|---|---|---|"
    )
    for name, corpus, _, batched, single in rows[: 2 * len(d4_variants)]:
        print(
            f"| {name} | {corpus} test | {base_batched[corpus] / batched:.2f}x | {base_single[corpus] / single:.2f}x | "
            f"{'met' if batched <= GOAL_MS else 'missed'} ({batched:.2f} ms) | "
            f"{'met' if single <= SINGLE_GOAL_MS else 'missed'} ({single:.2f} ms) |"
        )
    print(
        "\n| D4 runtime | texts | F1 reference | F1 this | change (points) | max abs score diff | decisions flipped |"
    )
    print("|---|---|---|---|---|---|---|")
    for corpus, sample in texts.items():
        reference = d4.score(sample)
        for name, detector in d4_variants[1:]:
            result = agreement(reference, detector.score(sample), corpora[corpus].labels("test"))
            print(
                f"| {name} | {corpus} test (n={result.n}) | {100 * result.f1_reference:.2f} | "
                f"{100 * result.f1_candidate:.2f} | {result.f1_change_points:+.2f} | {result.max_abs_diff:.2e} | "
                f"{result.decision_flips} |"
            )
    record(__file__, headline_rows(rows, d4_variants[0][0], d4_variants[3][0]), args.results_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
