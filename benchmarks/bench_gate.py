"""The adapter load gate's latency on an adapter it has no screening-table row for (our goal: a verdict within 10 s).

Such an adapter is scored on the spot (``study.LabScorer``): every behavioural layer on the de-quantised base of the
``tiny`` profile, on the public probe draw. The adapter is a seeded rank-8 LoRA on q / v of every layer (the zoo's
default shape); its values do not change the cost. Measured side by side in one run:

1. the parts of one on-the-spot score (``AdapterLab.score``: projection, output OOD, the likelihood layers, the
   greedy generation the behaviour layer reads), with ``--threads`` torch threads and with one;
2. the same adapter checked again: the first on-the-spot score against the scores stored for the same adapter file,
   reference, lab and draw (``ResultMemo``), as ``rvu adapters check --score`` and a recovery reuse them;
3. the first verdict (the lab's load + the score), and the same adapter checked again in a new process (the lab's
   load + the stored scores), against the 10 s goal. The lab's load reads the base model's answers from the state
   folder's cache; the first run on a machine computes them (about a minute and a half on two cores) and is
   reported as such.

    .venv/bin/python benchmarks/bench_gate.py [--threads 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench_results import Row, add_results_dir_argument, record

GOAL_SECONDS = 10.0
N_LAYERS, HIDDEN, KV = 30, 576, 192  # SmolLM2-135M: the tiny profile's base


def write_adapter(root: Path, adapter_id: str, seed: int, base) -> None:  # type: ignore[no-untyped-def]
    """A seeded rank-8 LoRA on q / v of every layer, saved as the zoo saves one (safetensors + manifest)."""
    import torch

    from rvu_pipelines.adapters.files import save_adapter

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(N_LAYERS):
        for module, out in (("q_proj", HIDDEN), ("v_proj", KV)):
            stem = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(8, HIDDEN, generator=generator) * 0.02
            tensors[f"{stem}.lora_B.weight"] = torch.randn(out, 8, generator=generator) * 0.02
    fields = {
        "adapter_id": adapter_id,
        "source": "bench",
        "label": "unknown",
        "category": "",
        "rank": 8,
        "alpha": 16,
        "target_modules": ["q_proj", "v_proj"],
    }
    save_adapter(root / adapter_id, tensors, fields, base=base)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    add_results_dir_argument(parser)
    args = parser.parse_args()

    import torch

    from rvu_pipelines.adapters.study import GATE_PARTS, AdapterLab, LabScorer
    from rvu_pipelines.result_memo import ResultMemo

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="rvu-bench-gate-"))
    started = time.perf_counter()
    lab = AdapterLab.for_profile("tiny", root=work / "zoo")
    lab_seconds = time.perf_counter() - started
    cached = lab.reference.from_cache  # the base's answers read from the state folder's cache
    for seed, adapter_id in enumerate(("reference", "candidate")):
        write_adapter(lab.root, adapter_id, seed, lab.base)
    reference, candidate = lab.verify("reference"), lab.verify("candidate")
    print(
        f"lab: {lab_seconds:.1f} s ({'base answers from the cache' if cached else 'base answers computed'}); "
        f"{len(lab.prompts)} probe prompts, {len(lab.sensitive)} sensitive, {len(lab.qa)} QA, "
        f"{len(lab.knowledge)} knowledge-base, {len(lab.follow_ups)} follow-up, {len(lab.hazard)} hazard items"
    )

    parts = {}
    for threads in (args.threads, 1):
        torch.set_num_threads(threads)
        parts[threads] = lab.score(candidate, reference)
    torch.set_num_threads(args.threads)
    print(f"\n{'part':<12}" + "".join(f"{f'{t} thread(s)':>14}" for t in parts))
    for part in GATE_PARTS:
        print(f"{part:<12}" + "".join(f"{getattr(s, f'{part}_seconds'):>12.1f} s" for s in parts.values()))
    print(f"{'all':<12}" + "".join(f"{s.gate_seconds:>12.1f} s" for s in parts.values()))

    memo = ResultMemo(work / "memo")
    started = time.perf_counter()
    first = LabScorer(lab, reference, memo=memo).score(candidate)
    first_seconds = time.perf_counter() - started
    started = time.perf_counter()
    again = LabScorer(lab, reference, memo=memo).score(candidate)
    again_seconds = time.perf_counter() - started
    if again != first:
        raise SystemExit("the stored scores differ from the measured ones")
    verdict_seconds = lab_seconds + first_seconds
    print(
        f"\nchecked again: {first_seconds:.1f} s scored on the spot, {again_seconds * 1000:.0f} ms from stored scores; "
        f"first verdict {verdict_seconds:.1f} s (lab {lab_seconds:.1f} s + score) against the {GOAL_SECONDS:.0f} s goal"
    )
    one, many = parts[1].gate_seconds, parts[args.threads].gate_seconds
    rows = [
        Row("on-the-spot score, one adapter", "1 thread", one, f"{args.threads} threads", many, "s", False),
        Row("adapter checked again", "scored on the spot", first_seconds, "stored scores", again_seconds, "s", False),
        Row(
            "first verdict (lab load + score) vs the goal",
            "goal",
            GOAL_SECONDS,
            "measured" + ("" if cached else ", base answers computed"),
            verdict_seconds,
            "s",
            False,
        ),
        Row(
            "the same adapter checked again in a new process (lab load + stored scores) vs the goal",
            "goal",
            GOAL_SECONDS,
            "measured",
            lab_seconds + again_seconds,
            "s",
            False,
        ),
    ]
    record(__file__, rows, args.results_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
